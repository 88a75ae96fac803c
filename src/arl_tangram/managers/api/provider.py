"""Shell: one API provider: admission (wait for a key with quota), the outbound request
through one keep-alive ``httpx.AsyncClient``, retries with Retry-After or full-jitter
backoff, and the per-call trace that becomes an ``ApiResult``.

Concurrency: callers queue FIFO on the provider's admission lock (``asyncio.Lock`` wakes
waiters in order), and the head waits there for quota; nothing else happens under it, no I/O
in particular. The HTTP request runs outside, holding only its key's concurrency slot, which
a ``finally`` returns whatever way the attempt ends (answer, error, timeout, cancellation).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from arl_tangram.managers.api.bucket import full_jitter_backoff_s, parse_retry_after
from arl_tangram.managers.api.config import RETRY_STATUSES, ProviderConfig
from arl_tangram.managers.api.keys import Grant, KeyPool, KeyState
from arl_tangram.managers.api.results import ApiRequest, ApiResult


@dataclass
class _Trace:
    """What one call has seen so far, across its attempts."""

    attempts: int = 0
    upstream_429s: int = 0
    waited_s: float = 0.0
    tokens_used: int = 0
    response: httpx.Response | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def result(self, outcome: str, cause: str | None = None) -> ApiResult:
        return ApiResult(
            outcome=outcome,
            status=None if self.response is None else self.response.status_code,
            body=self.body,
            headers=self.headers,
            tokens_used=self.tokens_used,
            retries=max(0, self.attempts - 1),
            upstream_429s=self.upstream_429s,
            waited_s=self.waited_s,
            cause=cause,
        )


class Provider:
    """Owned by ``ApiManager``; ``call`` may run concurrently from many tasks of one loop."""

    def __init__(
        self,
        config: ProviderConfig,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self._rng = rng
        self.pool = KeyPool(config, clock())
        self._admission = asyncio.Lock()
        self._released = asyncio.Event()
        self.num_waiting = 0
        self.num_429s = 0
        slots = config.num_keys * config.max_concurrency
        self._client = httpx.AsyncClient(
            base_url=config.base_url,
            limits=httpx.Limits(max_connections=slots, max_keepalive_connections=slots),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def call(self, request: ApiRequest, declared: int | None, timeout_s: float) -> ApiResult:
        """Run ``request`` to one terminal outcome within ``timeout_s``. Cancellation of the
        calling task propagates (``CancelledError``) after the key's slot is returned."""
        cfg = self.config
        trace = _Trace()
        deadline = self._clock() + timeout_s
        while True:
            grant = await self._acquire(declared, deadline, trace)
            if grant is None:
                return trace.result("timed_out", self._quota_timeout_cause(timeout_s, trace))
            trace.attempts += 1
            failure, timed_out = await self._attempt(grant, request, declared, deadline, trace)
            if timed_out:
                return trace.result("timed_out", f"provider {cfg.name!r} gave no answer within the call's timeout_s={timeout_s:g}")
            response = trace.response
            if failure is None and response is not None and response.is_success:
                return trace.result("succeeded")
            if failure is None and response is not None and response.status_code not in RETRY_STATUSES:
                return trace.result("failed", f"provider {cfg.name!r} answered {response.status_code}")
            retry = trace.attempts - 1
            if retry >= cfg.max_retries:
                return self._final(trace, failure)
            delay_s = full_jitter_backoff_s(retry, cfg.backoff_base_s, cfg.backoff_cap_s, self._rng)
            if failure is None and response is not None:
                after_s = parse_retry_after(response.headers.get("retry-after"), time.time())
                delay_s = delay_s if after_s is None else after_s
                if response.status_code == 429:
                    # the limit is this key's: hold the key back, let the retry take another
                    self.pool.block(grant.key, self._clock() + delay_s)
                    continue
            if self._clock() + delay_s >= deadline:
                if failure is not None:
                    return self._final(trace, failure)
                return trace.result("timed_out", f"provider {cfg.name!r} asked to retry after {delay_s:.3g} s, past the call's timeout_s={timeout_s:g}")
            trace.waited_s += delay_s
            await asyncio.sleep(delay_s)

    async def _acquire(self, declared: int | None, deadline: float, trace: _Trace) -> Grant | None:
        """Wait (FIFO, bounded by ``deadline``) for a key with a request token, a free slot
        and the tokens to reserve; reserve them. ``None``: the deadline passed first."""
        start = self._clock()
        waited = False
        self.num_waiting += 1
        try:
            async with asyncio.timeout(max(0.0, deadline - start)), self._admission:
                while True:
                    now = self._clock()
                    key, wait_s = self.pool.pick(declared, now)
                    if key is not None:
                        grant = self.pool.reserve(key, declared, now)
                        if waited:
                            key.num_waits += 1
                            key.waited_s += now - start
                        trace.waited_s += now - start
                        return grant
                    waited = True
                    # no await between pick and clear: a release cannot slip in unseen
                    self._released.clear()
                    try:
                        async with asyncio.timeout(None if math.isinf(wait_s) else wait_s):
                            await self._released.wait()
                    except TimeoutError:
                        pass  # quota refilled (or the outer deadline: the loop sees it)
        except TimeoutError:
            trace.waited_s += self._clock() - start
            return None
        finally:
            self.num_waiting -= 1

    async def _attempt(
        self, grant: Grant, request: ApiRequest, declared: int | None, deadline: float, trace: _Trace
    ) -> tuple[httpx.HTTPError | None, bool]:
        """Send once on ``grant``'s key; record the answer in ``trace``. Returns (transport
        error or None, whether the call's deadline cut the attempt)."""
        used: int | None = 0  # no answer: the provider did no work we know of
        learn = False
        try:
            remaining_s = deadline - self._clock()
            if remaining_s <= 0:
                return None, True
            try:
                async with asyncio.timeout(remaining_s):
                    response = await self._send(grant.key, request, remaining_s)
            except TimeoutError:
                return None, True
            except httpx.HTTPError as exc:
                return exc, False
            trace.response = response
            trace.headers = dict(response.headers)
            trace.body = _parse_body(response)
            used = usage_tokens(trace.body)
            learn = response.is_success and used is not None
            if response.status_code == 429:
                trace.upstream_429s += 1
                self.num_429s += 1
                grant.key.num_429s += 1
            if used is None and not response.is_success:
                used = 0
            return None, False
        finally:
            trace.tokens_used += self.pool.release(grant, used, declared, self._clock(), learn)
            self._released.set()

    async def _send(self, key: KeyState, request: ApiRequest, remaining_s: float) -> httpx.Response:
        cfg = self.config
        headers = dict(request.headers or {})
        headers[cfg.auth_header] = cfg.auth_value(key.secret)
        return await self._client.request(
            request.method,
            request.path,
            json=request.json,
            params=dict(request.params) if request.params is not None else None,
            headers=headers,
            timeout=httpx.Timeout(min(cfg.request_timeout_s, remaining_s)),
        )

    def _final(self, trace: _Trace, failure: httpx.HTTPError | None) -> ApiResult:
        """Retries spent: a transport failure is ``error`` naming the provider; a retryable
        answer (429, 503, ...) is the final non-2xx answer, ``failed``."""
        cfg = self.config
        if failure is not None:
            kind = "timed out" if isinstance(failure, httpx.TimeoutException) else "unreachable"
            return trace.result(
                "error",
                f"provider {cfg.name!r} {kind} at {cfg.base_url} after {trace.attempts} attempt(s): "
                f"{type(failure).__name__}: {failure}",
            )
        status = None if trace.response is None else trace.response.status_code
        return trace.result("failed", f"provider {cfg.name!r} answered {status} after {trace.attempts} attempt(s)")

    def _quota_timeout_cause(self, timeout_s: float, trace: _Trace) -> str:
        cfg = self.config
        limits = f"rate_per_s={cfg.rate_per_s:g}, max_concurrency={cfg.max_concurrency}"
        if cfg.tokens_per_min is not None:
            limits += f", tokens_per_min={cfg.tokens_per_min}"
        pushed_back = f"; {trace.upstream_429s} upstream 429(s) held keys back" if trace.upstream_429s else ""
        return (
            f"no quota on provider {cfg.name!r} within the call's timeout_s={timeout_s:g} "
            f"({cfg.num_keys} key(s), per key {limits}{pushed_back})"
        )

    def status(self) -> dict[str, Any]:
        now = self._clock()
        keys = {key.label: key.status(now) for key in self.pool.keys}
        return {
            "base_url": self.config.base_url,
            "in_flight": sum(k.in_flight for k in self.pool.keys),
            "waiting": self.num_waiting,
            "upstream_429s": self.num_429s,
            "waits": sum(k.num_waits for k in self.pool.keys),
            "tokens_used": sum(k.tokens_used for k in self.pool.keys),
            "keys": keys,
        }


def _parse_body(response: httpx.Response) -> Any:
    text = response.text
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def usage_tokens(body: Any) -> int | None:
    """Tokens an OpenAI-shaped answer reports: ``usage.total_tokens``, else prompt +
    completion tokens; ``None`` when it reports none."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
        return sum(parts)  # type: ignore[arg-type]
    return None
