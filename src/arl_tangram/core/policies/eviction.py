"""Core: greedy eviction, deferring the last candidates when that lowers the estimated total ACT.

The objective is exact for the scheduled candidates (their duration at the allocated DoP)
and estimated for the deferred ones and the rest of the pool's queue with a
completion-time heap: replay when running and scheduled actions release their units and
start each waiting action, FCFS, as soon as its minimum fits. Deferring only delays;
nothing running is touched.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from arl_tangram.core.policies.waterfill import Claim, allocate

# How many future releases a waiting claim may wait for in the estimate: enough to see a
# wide action free its cores, few enough to keep a round's cost bounded.
MAX_LOOKAHEAD_RELEASES = 16
# How much of a pool's backlog the estimate charges deferrals for.
MAX_BACKLOG = 32


@dataclass(frozen=True)
class Plan:
    start: tuple[int, ...]  # indices (FCFS order) of the candidates that start now
    dops: tuple[int, ...]  # their DoPs, aligned with ``start``
    objective_s: float
    evictions: int


def estimate_objective(
    claims: Sequence[Claim],
    dops: Sequence[int],
    waiting: Sequence[Claim],
    free: int,
    releases: Sequence[tuple[float, int]],
    now: float,
) -> float:
    """Σ duration of scheduled claims + Σ (estimated wait + duration) of ``waiting``, in FCFS order.

    ``releases`` are (time, cost units) freed by running actions; ``free`` is what is left
    after the scheduled claims took theirs.
    """
    total = 0.0
    heap = list(releases)
    for c, m in zip(claims, dops, strict=True):
        d = c.durations[m - c.dop_min]
        total += d
        heap.append((now + d, m * c.unit_cost))
    heapq.heapify(heap)
    t = now
    pop, push = heapq.heappop, heapq.heappush
    for c in waiting:
        cost, lo = c.unit_cost, c.dop_min
        need = lo * cost
        while free < need and heap:
            at, units = pop(heap)
            if at > t:
                t = at
            free += units
        if free < need:
            return float("inf")  # can never start in this pool: treat as unbounded
        t, free = _best_start(c, t, free, heap)
        m = free // cost
        if m > c.dop_max:
            m = c.dop_max
        d = c.durations[m - lo]
        total += (t - now) + d
        free -= m * cost
        push(heap, (t + d, m * cost))
    return total


def _best_start(c: Claim, t: float, free: int, heap: list[tuple[float, int]]) -> tuple[float, int]:
    """When a waiting claim would start: the release time that minimises its completion.

    Waiting for a few more releases can beat starting at once on scraps; the releases it
    waits for are consumed from ``heap`` (the claim takes them), later ones stay.
    """
    cost, lo, hi, durations = c.unit_cost, c.dop_min, c.dop_max, c.durations
    full = hi * cost
    if free >= full or not heap:
        return t, free  # already gets all it can use, or nothing will ever free
    best_end = t + durations[min(hi, free // cost) - lo]
    best_t, best_free, best_n = t, free, 0
    popped: list[tuple[float, int]] = []
    pop = heapq.heappop
    cur_t, cur_free = t, free
    while heap and cur_free < full and len(popped) < MAX_LOOKAHEAD_RELEASES:
        item = pop(heap)
        popped.append(item)
        at, units = item
        if at > cur_t:
            cur_t = at
        cur_free += units
        end = cur_t + durations[min(hi, cur_free // cost) - lo]
        if end < best_end - 1e-12:
            best_end, best_t, best_free, best_n = end, cur_t, cur_free, len(popped)
    for item in popped[best_n:]:
        heapq.heappush(heap, item)
    return best_t, best_free


def plan_pool(
    claims: Sequence[Claim],
    free: int,
    releases: Sequence[tuple[float, int]],
    now: float,
    depth: int,
    backlog: Sequence[Claim] = (),
    deferrable: Sequence[bool] | None = None,
) -> Plan:
    """Choose which FCFS candidates start now, and their DoPs.

    Start with all candidates; walk them from the last to the first and tentatively defer
    each, keeping the deferral only if the objective strictly improves (the paper stops at
    the first non-improvement; going on past a cheap candidate finds the elastic one
    behind it that should wait for more units). At most ``depth`` tries. ``backlog``
    (queued actions of this pool that did not fit) is part of the estimate so deferrals
    that would delay it are charged for it. A candidate whose ``deferrable`` flag is False
    (it has aged past the bound) is never deferred, nor is a fixed-size candidate.
    """
    keep = list(range(len(claims)))
    best_dops, best_obj = _evaluate(claims, keep, [], free, releases, now, backlog)
    deferred: list[int] = []
    tries = 0
    for i in reversed(range(len(claims))):
        if tries >= depth:
            break
        if (deferrable is not None and not deferrable[i]) or claims[i].dop_min == claims[i].dop_max:
            continue  # aged, or fixed-size: deferring a fixed action frees too little to pay
        tries += 1
        trial_keep = [j for j in keep if j != i]
        trial_deferred = sorted(deferred + [i])
        dops, obj = _evaluate(claims, trial_keep, trial_deferred, free, releases, now, backlog)
        if obj < best_obj - 1e-9:
            keep, deferred, best_dops, best_obj = trial_keep, trial_deferred, dops, obj
    return Plan(tuple(keep), tuple(best_dops), best_obj, len(deferred))


def _evaluate(
    claims: Sequence[Claim],
    keep: list[int],
    deferred: list[int],
    free: int,
    releases: Sequence[tuple[float, int]],
    now: float,
    backlog: Sequence[Claim],
) -> tuple[list[int], float]:
    kept = [claims[i] for i in keep]
    dops = allocate(kept, free)
    used = sum(m * c.unit_cost for c, m in zip(kept, dops, strict=True))
    waiting = [claims[i] for i in deferred] + list(backlog[:MAX_BACKLOG])
    return dops, estimate_objective(kept, dops, waiting, free - used, releases, now)
