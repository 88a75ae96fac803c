"""Shell: configuration of one API provider for the API-quota manager, validated on
construction with errors (``SpecError``) that name the field and the rule.

Keys are secrets: they are kept out of ``repr`` and never appear in logs, status or results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from arl_tangram.core.errors import SpecError

#: status codes retried (with the answer's Retry-After if it has one, else jittered backoff):
#: 429 is a per-key limit, 503 a provider-wide overload, 502/504 a gateway that lost upstream
RETRY_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class ProviderConfig:
    """One provider: ``base_url``, a pool of ``keys`` and limits that apply to *each* key.

    - ``rate_per_s``: requests per second per key, paced by a token bucket of ``burst``
      requests (1 = strictly paced, one request every ``1 / rate_per_s`` seconds).
    - ``tokens_per_min``: model tokens per minute per key (None: unlimited), charged from the
      caller's declaration or the response's ``usage``.
    - ``max_concurrency``: calls in flight per key.
    - ``auth_header`` / ``auth_scheme``: the key is sent as ``<auth_header>: <scheme> <key>``
      (``Authorization: Bearer <key>`` by default; an empty scheme sends the bare key).
    - ``max_retries``: retries after a retryable status or a transport error; backoff is full
      jitter, ``uniform(0, min(backoff_cap_s, backoff_base_s * 2**attempt))``.
    - ``request_timeout_s``: one attempt's limit (the call's own deadline may cut it shorter).
    """

    name: str
    base_url: str
    keys: tuple[str, ...] = field(repr=False)
    rate_per_s: float = 10.0
    tokens_per_min: int | None = None
    max_concurrency: int = 8
    burst: float = 1.0
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer"
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        where = f"providers[{self.name}]"
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("providers.name", "must be a non-empty string", self.name)
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise SpecError(f"{where}.base_url", "must start with http:// or https://", self.base_url)
        keys = tuple(self.keys) if isinstance(self.keys, list | tuple) else None
        if not keys or not all(isinstance(k, str) and k for k in keys):
            # the value is left out on purpose: it would print the secrets
            raise SpecError(f"{where}.keys", "must be a non-empty list of non-empty strings", "<hidden>")
        object.__setattr__(self, "keys", keys)
        _positive_number(f"{where}.rate_per_s", self.rate_per_s)
        _positive_number(f"{where}.burst", self.burst, minimum=1.0)
        if self.tokens_per_min is not None:
            _integer(f"{where}.tokens_per_min", self.tokens_per_min, minimum=1)
        _integer(f"{where}.max_concurrency", self.max_concurrency, minimum=1)
        _integer(f"{where}.max_retries", self.max_retries, minimum=0)
        _positive_number(f"{where}.backoff_base_s", self.backoff_base_s)
        _positive_number(f"{where}.backoff_cap_s", self.backoff_cap_s)
        _positive_number(f"{where}.request_timeout_s", self.request_timeout_s)
        if not isinstance(self.auth_header, str) or not self.auth_header.strip():
            raise SpecError(f"{where}.auth_header", "must be a non-empty header name", self.auth_header)
        if not isinstance(self.auth_scheme, str):
            raise SpecError(f"{where}.auth_scheme", "must be a string (empty: the bare key)", self.auth_scheme)

    @property
    def num_keys(self) -> int:
        return len(self.keys)

    def auth_value(self, key: str) -> str:
        return f"{self.auth_scheme} {key}" if self.auth_scheme else key


def _positive_number(field_name: str, value: object, minimum: float | None = None) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if minimum is None:
        if not ok or value <= 0:  # type: ignore[operator]
            raise SpecError(field_name, "must be a finite number > 0", value)
    elif not ok or value < minimum:  # type: ignore[operator]
        raise SpecError(field_name, f"must be a finite number >= {minimum:g}", value)


def _integer(field_name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpecError(field_name, f"must be an integer >= {minimum}", value)
