"""Shell: a provider's key pool, the per-key quota accounting (requests/s, tokens/min,
concurrency, upstream back-off) and the choice of the key for the next request.

Time comes in as ``now``; nothing here awaits, so one caller at a time (the provider's
admission lock) can check and reserve without a race. Keys are addressed by ``label``
(``key0``, ``key1``, ...); the secret is read only when the request is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from arl_tangram.managers.api.bucket import TokenBucket
from arl_tangram.managers.api.config import ProviderConfig

#: weight of the newest observation in a key's running estimate of tokens per call
USAGE_EWMA_ALPHA = 0.3


@dataclass
class Grant:
    """What one attempt holds on a key: the concurrency slot and the tokens it reserved.

    Released exactly once (``KeyPool.release``), whatever way the attempt ends."""

    key: KeyState
    reserved_tokens: int
    released: bool = False


@dataclass
class KeyState:
    label: str
    secret: str = field(repr=False)
    rate: TokenBucket
    tokens: TokenBucket | None
    max_concurrency: int
    in_flight: int = 0
    blocked_until: float = 0.0  # an upstream 429's Retry-After (or backoff) for this key
    usage_estimate: float = 0.0  # tokens per call, learned from answers without a declaration
    num_usage_samples: int = 0
    num_requests: int = 0
    num_429s: int = 0
    num_waits: int = 0
    waited_s: float = 0.0
    tokens_used: int = 0
    last_used_seq: int = -1

    def wait_s(self, need_tokens: int, now: float) -> float:
        """Seconds until this key may start a request needing ``need_tokens``; ``inf`` while
        every concurrency slot is taken (a release, not time, frees one)."""
        if self.in_flight >= self.max_concurrency:
            return math.inf
        wait = max(0.0, self.blocked_until - now, self.rate.wait_s(1, now))
        if self.tokens is not None:
            wait = max(wait, self.tokens.wait_s(need_tokens, now))
        return wait

    def status(self, now: float) -> dict[str, object]:
        return {
            "in_flight": self.in_flight,
            "requests": self.num_requests,
            "upstream_429s": self.num_429s,
            "waits": self.num_waits,
            "waited_s": round(self.waited_s, 6),
            "tokens_used": self.tokens_used,
            "tokens_available": None if self.tokens is None else math.floor(self.tokens.level(now)),
            "blocked_for_s": round(max(0.0, self.blocked_until - now), 6),
        }


class KeyPool:
    """The keys of one provider. Callers hold the provider's admission lock around
    ``pick`` + ``reserve``; ``release`` and ``charge`` are synchronous so they also run from
    ``finally`` blocks of cancelled tasks."""

    def __init__(self, config: ProviderConfig, now: float) -> None:
        self.config = config
        self.keys = [
            KeyState(
                label=f"key{i}",
                secret=secret,
                rate=TokenBucket(config.burst, config.rate_per_s, now),
                tokens=(
                    None
                    if config.tokens_per_min is None
                    else TokenBucket(config.tokens_per_min, config.tokens_per_min / 60.0, now)
                ),
                max_concurrency=config.max_concurrency,
            )
            for i, secret in enumerate(config.keys)
        ]
        self._seq = 0

    def need_tokens(self, key: KeyState, declared: int | None) -> int:
        """Tokens to reserve before sending: the declaration, else the key's learned estimate;
        at least 1 so an exhausted minute budget makes callers wait."""
        if key.tokens is None:
            return 0
        guess = declared if declared is not None else math.ceil(key.usage_estimate)
        return max(1, min(guess, int(key.tokens.capacity)))

    def pick(self, declared: int | None, now: float) -> tuple[KeyState | None, float]:
        """The key that can start soonest: ``(key, 0.0)`` if one can start now, else
        ``(None, seconds until the soonest one can; inf if all wait for a slot)``. Ties go to
        fewer calls in flight, then the least recently used key, so load spreads evenly."""
        best: tuple[float, int, int] | None = None
        chosen: KeyState | None = None
        for key in self.keys:
            rank = (key.wait_s(self.need_tokens(key, declared), now), key.in_flight, key.last_used_seq)
            if best is None or rank < best:
                best, chosen = rank, key
        assert best is not None and chosen is not None  # config guarantees at least one key
        return (chosen, 0.0) if best[0] <= 0.0 else (None, best[0])

    def reserve(self, key: KeyState, declared: int | None, now: float) -> Grant:
        """Take a request token, a concurrency slot and the reserved tokens of ``key``."""
        reserved = self.need_tokens(key, declared)
        key.rate.take(1, now)
        if key.tokens is not None:
            key.tokens.take(reserved, now)
        key.in_flight += 1
        key.num_requests += 1
        key.last_used_seq = self._seq
        self._seq += 1
        return Grant(key=key, reserved_tokens=reserved)

    def release(
        self, grant: Grant, used_tokens: int | None, declared: int | None, now: float, learn: bool = False
    ) -> int:
        """Free the slot; charge ``used_tokens`` (from ``usage``; None: unknown, charge the
        declaration) against the reservation; ``learn``: a successful answer's ``usage``,
        which updates the key's estimate for undeclared calls. Returns the tokens charged.
        Idempotent: a second release does nothing."""
        if grant.released:
            return 0
        grant.released = True
        key = grant.key
        key.in_flight -= 1
        charged = used_tokens if used_tokens is not None else (declared or 0)
        if learn and used_tokens is not None and declared is None:
            # the first answer sets the estimate: starting an average at 0 would let the
            # next calls reserve far too little while it converges
            alpha = 1.0 if key.num_usage_samples == 0 else USAGE_EWMA_ALPHA
            key.usage_estimate += alpha * (used_tokens - key.usage_estimate)
            key.num_usage_samples += 1
        if key.tokens is not None:
            delta = charged - grant.reserved_tokens
            if delta > 0:
                key.tokens.take(delta, now)
            elif delta < 0:
                key.tokens.give(-delta, now)
        key.tokens_used += charged
        return charged

    def block(self, key: KeyState, until: float) -> None:
        """Hold ``key`` back until ``until`` (an upstream 429 for this key)."""
        key.blocked_until = max(key.blocked_until, until)
