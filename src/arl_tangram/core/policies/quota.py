"""Core: API quota actions: a global token bucket + concurrency cap, or unmanaged client practice."""

from __future__ import annotations

from arl_tangram.core import ledger
from arl_tangram.core.decisions import Decision
from arl_tangram.core.fair_share import share_order
from arl_tangram.core.resources import ZERO
from arl_tangram.core.state import StateEditor

# Refills accumulate in float steps; a token promised at a wake-up time must be there then.
BUCKET_EPS = 1e-9


def schedule_managed(ed: StateEditor, cause: str) -> tuple[list[Decision], float | None]:
    """Admit API actions FCFS while the provider has concurrency and rate tokens.

    Returns the decisions and when the next rate token arrives if an action is left waiting
    for one (the scheduler's wake-up), so bursts are smoothed instead of answered with 429s.
    """
    decisions: list[Decision] = []
    wake: float | None = None
    blocked: set[str] = set()
    for qa in list(share_order(ed, "queue_api")):
        if qa.spec.binding.name in blocked:
            continue
        provider = qa.spec.binding.name
        q = ed.refill_quota(provider)
        need = qa.spec.demand_at(qa.spec.dop_min).quota_tokens
        if q.free_tokens >= need and q.bucket >= 1.0 - BUCKET_EPS:
            decisions.append(ledger.start_action(ed, qa, provider, qa.spec.dop_min, "quota: token granted", cause))
            continue
        blocked.add(provider)  # FCFS per provider
        if q.bucket < 1.0 - BUCKET_EPS:
            pool = ed.spec.quota_pool(provider)
            assert pool is not None
            at = ed.now_s + (1.0 - q.bucket) / pool.rate_per_s
            wake = at if wake is None else min(wake, at)
    return decisions, wake


def next_token_s(ed: StateEditor) -> float | None:
    """When a rate token next arrives for a provider whose head-of-line API action waits for
    one (the wake-up ``schedule_managed`` reports), read from the state after the round."""
    wake: float | None = None
    seen: set[str] = set()
    for qa in ed.queue_api.values():
        provider = qa.spec.binding.name
        if provider in seen:
            continue
        seen.add(provider)
        pool = ed.spec.quota_pool(provider)
        q = ed.quota.get(provider)
        if pool is None or q is None or pool.rate_per_s <= 0:
            continue
        bucket = min(float(pool.max_concurrency), q.bucket + (ed.now_s - q.refilled_s) * pool.rate_per_s)
        if bucket < 1.0 - BUCKET_EPS:
            at = ed.now_s + (1.0 - bucket) / pool.rate_per_s
            wake = at if wake is None else min(wake, at)
    return wake


def schedule_unmanaged(ed: StateEditor, cause: str) -> list[Decision]:
    """Today's practice: each worker calls the provider at once; overload comes back as 429s."""
    decisions: list[Decision] = []
    for qa in list(ed.queue_api.values()):
        # holds nothing of the global pool: no one is counting
        decisions.append(ledger.start_action(ed, qa, qa.spec.binding.name, qa.spec.dop_min, "unmanaged client call", cause, grant=ZERO))
    return decisions
