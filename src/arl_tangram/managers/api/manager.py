"""Shell: the API-quota manager: named providers, each with a key pool and per-key limits
(requests/s, tokens/min, concurrent calls); calls wait for quota instead of failing, honour
upstream 429/Retry-After and end in exactly one outcome.

Who calls: the runtime's controller (one loop), for actions bound to an API provider. The
core decides *when* a call may start (its quota pools, built from the same configuration);
this manager is the mechanism that keeps each key inside its provider's limits even if the
core's view is coarse (it does not know tokens/min or keys).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Sequence
from typing import Any

from arl_tangram.core.errors import SpecError
from arl_tangram.managers.api.config import ProviderConfig
from arl_tangram.managers.api.provider import Provider
from arl_tangram.managers.api.results import ApiRequest, ApiResult

log = logging.getLogger(__name__)


class ApiManager:
    """Outbound calls to configured providers. One instance per event loop; ``call`` may run
    concurrently from many tasks. ``aclose`` ends every in-flight call with ``cancelled``;
    calls after it end with ``error``. ``seed`` makes the backoff jitter reproducible."""

    def __init__(self, providers: Sequence[ProviderConfig], *, seed: int | None = None) -> None:
        names = [p.name for p in providers]
        if len(set(names)) != len(names):
            raise SpecError("providers.name", "must be unique", names)
        rng = random.Random(seed)
        self._providers = {cfg.name: Provider(cfg, rng) for cfg in providers}
        self._calls: set[asyncio.Task[ApiResult]] = set()
        self._closed = False

    def providers(self) -> list[str]:
        return sorted(self._providers)

    async def call(
        self,
        provider: str,
        request: ApiRequest,
        *,
        tokens: int | None = None,
        timeout_s: float = 60,
    ) -> ApiResult:
        """Send ``request`` to ``provider`` with one of its keys, waiting for quota (bounded by
        ``timeout_s``, which covers waiting, retries and HTTP). ``tokens``: the model tokens
        the call will use, reserved up front; without it the answer's ``usage`` is charged.

        Bad arguments raise ``SpecError`` naming the field; everything else is an
        ``ApiResult``. Cancelling the awaiting task cancels the call (``CancelledError``
        propagates) and returns its key's concurrency slot first.
        """
        target = self._validate(provider, request, tokens, timeout_s)
        if self._closed:
            return ApiResult("error", cause="the API manager is closed")
        task = asyncio.create_task(target.call(request, tokens, float(timeout_s)), name=f"api-call:{provider}")
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # our caller was cancelled: the call went down with it
            return ApiResult("cancelled", cause="the API manager closed during the call")
        except Exception as exc:  # a bug here must not take the controller down
            log.exception("API call to provider %r failed unexpectedly", provider)
            return ApiResult("error", cause=f"internal error in the API manager: {type(exc).__name__}: {exc}")

    def _validate(self, provider: str, request: ApiRequest, tokens: int | None, timeout_s: float) -> Provider:
        target = self._providers.get(provider)
        if target is None:
            known = ", ".join(self.providers()) or "none configured"
            raise SpecError("provider", f"must be a configured provider ({known})", provider)
        if not isinstance(request, ApiRequest):
            raise SpecError("request", "must be an ApiRequest", type(request).__name__)
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
            raise SpecError("tokens", "must be an integer >= 0 or None", tokens)
        if (
            not isinstance(timeout_s, int | float)
            or isinstance(timeout_s, bool)
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise SpecError("timeout_s", "must be a finite number > 0", timeout_s)
        auth = target.config.auth_header.lower()
        if request.headers and any(name.lower() == auth for name in request.headers):
            raise SpecError("request.headers", f"must not set {target.config.auth_header!r}: the manager owns the keys", "<hidden>")
        return target

    async def aclose(self) -> None:
        """End in-flight calls (``cancelled``) and close the HTTP clients. Idempotent."""
        self._closed = True
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.gather(*calls, return_exceptions=True)
        for provider in self._providers.values():
            await provider.aclose()

    async def __aenter__(self) -> ApiManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def status(self) -> dict[str, Any]:
        """Per provider: ``in_flight``, ``waiting``, ``upstream_429s``, ``waits``,
        ``tokens_used`` and the same per key under ``keys`` (labels ``key0``, ``key1``, ...;
        never the keys themselves)."""
        return {name: self._providers[name].status() for name in self.providers()}
