"""Shell: the API-quota manager's accounting pieces with time passed in: a token bucket,
the Retry-After parser and the full-jitter backoff. No clock reads here, so the rules are
testable without sleeping."""

from __future__ import annotations

import math
import random
from email.utils import parsedate_to_datetime


class TokenBucket:
    """``capacity`` units, refilled at ``refill_per_s``; starts full at ``now``.

    ``take`` may drive the level below zero (a debt): the tokens a call used are known only
    after its answer, and charging them late must still slow later calls down. Callers pass a
    non-decreasing ``now``; an earlier one is treated as no time passing.
    """

    def __init__(self, capacity: float, refill_per_s: float, now: float) -> None:
        if capacity <= 0 or refill_per_s <= 0:
            raise ValueError("capacity and refill_per_s must be > 0")
        self.capacity = float(capacity)
        self.refill_per_s = float(refill_per_s)
        self._level = float(capacity)
        self._at = now

    def level(self, now: float) -> float:
        self._refill(now)
        return self._level

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``min(amount, capacity)`` units are available (0.0: now)."""
        self._refill(now)
        missing = min(amount, self.capacity) - self._level
        return 0.0 if missing <= 1e-9 else missing / self.refill_per_s

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self._level -= amount

    def give(self, amount: float, now: float) -> None:
        """Return ``amount`` units (a reservation larger than the use); never above capacity."""
        self._refill(now)
        self._level = min(self.capacity, self._level + amount)

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.refill_per_s)
            self._at = now


def parse_retry_after(value: str | None, now_epoch_s: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds (fractions accepted, as
    some providers send them) or an HTTP date; ``None`` when absent or unparseable. Never
    negative: a date in the past means "now"."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(text).timestamp() - now_epoch_s
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def full_jitter_backoff_s(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Full jitter (AWS architecture blog): ``uniform(0, min(cap, base * 2**attempt))``; it
    spreads retries of many callers that failed together. ``attempt`` counts from 0."""
    ceiling = min(cap_s, base_s * (2.0 ** min(attempt, 62)))
    return rng.uniform(0.0, ceiling)
