"""Shell: the errors the live runtime raises at admission (``Controller.submit`` and
``Controller.create_env``), before anything is queued.

Both are raised synchronously, so a caller (the HTTP API, the SDK) maps them to a status
without waiting: ``TenantLimitError`` is a ``SpecError`` naming the limit it hit (a 4xx),
``OverloadedError`` says when to come back (429/503 with ``Retry-After``).
"""

from __future__ import annotations

from arl_tangram.core.errors import SpecError


class TenantLimitError(SpecError):
    """A tenant is at one of its configured limits; ``field`` names it
    (``tenants.<name>.max_envs``, ``...max_concurrent_actions``, ``...max_mem_bytes``),
    ``value`` is what the request would have brought the tenant to."""

    def __init__(self, tenant: str, limit: str, rule: str, value: object = None) -> None:
        self.tenant = tenant
        self.limit = limit
        super().__init__(f"tenants.{tenant}.{limit}", rule, value)


class OverloadedError(Exception):
    """The service holds ``max_queued_actions`` unfinished actions; nothing was queued.
    ``retry_after_s`` is a hint of when capacity is likely back (``Retry-After``)."""

    def __init__(self, unfinished: int, limit: int, retry_after_s: float) -> None:
        self.unfinished = unfinished
        self.limit = limit
        self.retry_after_s = retry_after_s
        super().__init__(
            f"overloaded: {unfinished} unfinished actions (limit {limit}); retry after {retry_after_s:.1f} s"
        )
