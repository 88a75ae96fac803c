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


@dataclass(frozen=True)
class Plan:
    scheduled: int  # the first ``scheduled`` candidates start now
    dops: tuple[int, ...]
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
        d = c.duration(m)
        total += d
        heap.append((now + d, m * c.unit_cost))
    heapq.heapify(heap)
    t = now
    for c in waiting:
        while free < c.dop_min * c.unit_cost and heap:
            at, units = heapq.heappop(heap)
            t = max(t, at)
            free += units
        if free < c.dop_min * c.unit_cost:
            return float("inf")  # can never start in this pool: treat as unbounded
        m = min(c.dop_max, free // c.unit_cost)
        d = c.duration(m)
        total += (t - now) + d
        free -= m * c.unit_cost
        heapq.heappush(heap, (t + d, m * c.unit_cost))
    return total


def plan_pool(
    claims: Sequence[Claim],
    free: int,
    releases: Sequence[tuple[float, int]],
    now: float,
    depth: int,
    backlog: Sequence[Claim] = (),
) -> Plan:
    """Choose how many FCFS candidates start now, and their DoPs.

    Start with all candidates; repeatedly try deferring the last scheduled one and keep the
    deferral only if the objective strictly improves; stop at the first non-improvement or
    after ``depth`` tries. ``backlog`` (queued actions of this pool that did not fit) is part
    of the estimate so deferrals that would delay it are charged for it.
    """
    n = len(claims)
    dops = allocate(claims, free)
    used = sum(m * c.unit_cost for c, m in zip(claims, dops, strict=True))
    best = Plan(n, tuple(dops), estimate_objective(claims, dops, backlog, free - used, releases, now), 0)
    tries = 0
    while best.scheduled > 1 and tries < depth:
        k = best.scheduled - 1
        trial = allocate(claims[:k], free)
        used = sum(m * c.unit_cost for c, m in zip(claims[:k], trial, strict=True))
        waiting = list(claims[k:]) + list(backlog)
        obj = estimate_objective(claims[:k], trial, waiting, free - used, releases, now)
        tries += 1
        if obj < best.objective_s - 1e-9:
            best = Plan(k, tuple(trial), obj, best.evictions + 1)
        else:
            break
    return best
