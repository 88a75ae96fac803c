"""Shell: what a caller hands the API-quota manager (``ApiRequest``) and what it gets back
(``ApiResult``, one terminal outcome per call)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.errors import SpecError

#: every call ends in exactly one of these
OUTCOMES = ("succeeded", "failed", "timed_out", "error", "cancelled")
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class ApiRequest:
    """One HTTP request to a provider, relative to its ``base_url``. ``headers`` may not set
    the provider's auth header: the manager owns the keys."""

    method: str = "POST"
    path: str = "/"
    json: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or self.method.upper() not in METHODS:
            raise SpecError("request.method", f"must be one of {', '.join(sorted(METHODS))}", self.method)
        object.__setattr__(self, "method", self.method.upper())
        if not isinstance(self.path, str) or not self.path.startswith("/") or "://" in self.path:
            raise SpecError("request.path", "must be a path starting with '/'", self.path)


@dataclass(frozen=True)
class ApiResult:
    """The end of one call.

    - ``outcome``: ``succeeded`` (2xx), ``failed`` (a final non-2xx answer, retries spent or
      not retryable), ``timed_out`` (the call's ``timeout_s`` passed, waiting for quota or for
      the answer), ``error`` (the provider unreachable after bounded retries; ``cause`` names
      it), ``cancelled`` (the manager closed during the call).
    - ``status``/``body``/``headers``: the last answer (``body`` parsed JSON, else text);
      ``None``/``None``/``{}`` when no answer came.
    - ``tokens_used``: charged to the key's tokens/min budget (``usage.total_tokens`` when the
      answer reports it, else the caller's declaration, else 0).
    - ``retries``: attempts after the first; ``upstream_429s``: 429 answers seen by this call;
      ``waited_s``: time spent waiting for quota and in backoff (not in HTTP).
    """

    outcome: str
    status: int | None = None
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    tokens_used: int = 0
    retries: int = 0
    upstream_429s: int = 0
    waited_s: float = 0.0
    cause: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"
