"""Core: splitting a pool's spare units among elastic candidates to minimise total duration.

For convex ``T(m)`` (every Amdahl curve; most profiled tables) greedy water-filling by
marginal gain per unit cost is optimal. For a non-convex table the DP over (candidate,
units) finds the optimum exactly; it is slower, so it runs only when needed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Claim:
    """One candidate's view for allocation: DoP bounds, cost per unit, duration at each DoP.

    ``durations[m - dop_min]`` is T(m); built once per round by ``Claim.of`` so the
    allocation and eviction loops only index a tuple.
    """

    dop_min: int
    dop_max: int
    unit_cost: int
    durations: tuple[float, ...]
    convex: bool

    @classmethod
    def of(cls, dop_min: int, dop_max: int, unit_cost: int, duration: Callable[[int], float]) -> Claim:
        durations = tuple(duration(m) for m in range(dop_min, dop_max + 1))
        gains = [a - b for a, b in zip(durations, durations[1:], strict=False)]
        convex = all(g2 <= g1 + 1e-12 for g1, g2 in zip(gains, gains[1:], strict=False))
        return cls(dop_min, dop_max, unit_cost, durations, convex)

    def duration(self, dop: int) -> float:
        return self.durations[dop - self.dop_min]


def waterfill(claims: Sequence[Claim], budget: int) -> list[int]:
    """DoPs for ``claims`` within ``budget`` (units of cost), each starting from ``dop_min``.

    Precondition: the minima fit (``sum(dop_min * unit_cost) <= budget``). Greedy: give the
    next unit to the claim with the largest duration saved per unit of cost; ties go to
    the earlier claim (FCFS), so the result is deterministic.
    """
    dops = [c.dop_min for c in claims]
    budget -= sum(c.dop_min * c.unit_cost for c in claims)
    heap: list[tuple[float, int]] = []
    for i, c in enumerate(claims):
        if c.dop_min < c.dop_max:
            heap.append((-_gain(c, c.dop_min), i))
    heapq.heapify(heap)
    while heap and budget > 0:
        neg_gain, i = heapq.heappop(heap)
        c = claims[i]
        if neg_gain >= 0 or c.unit_cost > budget:
            continue
        dops[i] += 1
        budget -= c.unit_cost
        if dops[i] < c.dop_max:
            heapq.heappush(heap, (-_gain(c, dops[i]), i))
    return dops


def _gain(c: Claim, m: int) -> float:
    return (c.duration(m) - c.duration(m + 1)) / c.unit_cost


def dp_allocate(claims: Sequence[Claim], budget: int) -> list[int]:
    """Exact minimum of the summed durations by DP over spare budget; O(k · B · range)."""
    unit = math.gcd(*(c.unit_cost for c in claims))  # work in the coarsest common unit
    spare = (budget - sum(c.dop_min * c.unit_cost for c in claims)) // unit
    # best[b] = (total duration, choices) using at most b spare cost for the claims so far
    best: list[tuple[float, tuple[int, ...]]] = [(0.0, ())] * (spare + 1)
    for c in claims:
        new: list[tuple[float, tuple[int, ...]]] = []
        for b in range(spare + 1):
            options = []
            for m in range(c.dop_min, c.dop_max + 1):
                extra = (m - c.dop_min) * c.unit_cost // unit
                if extra > b:
                    break
                total, picks = best[b - extra]
                options.append((total + c.duration(m), picks + (m,)))
            new.append(min(options, key=lambda o: o[0]))
        best = new
    return list(best[spare][1])


def allocate(claims: Sequence[Claim], budget: int) -> list[int]:
    """Water-filling when every claim is convex, else the DP."""
    if all(c.convex for c in claims):
        return waterfill(claims, budget)
    return dp_allocate(claims, budget)
