"""The capacity bound against brute-force optima on small literal instances."""

from __future__ import annotations

import itertools
import math

import pytest

from arl_tangram.sim.bound import BoundInstance, amdahl_row, capacity_bound

INF = math.inf


def brute_force(arrivals: list[int], rows: list[list[float]], capacity: int, horizon: int = 10) -> float:
    """Least total ACT over every non-preemptive schedule with integer starts (optimal for
    integer data: any schedule left-shifts onto integer starts) and a DoP per action."""
    options = []
    for r, row in zip(arrivals, rows, strict=True):
        options.append([(s, m + 1, row[m]) for s in range(r, r + horizon) for m in range(len(row)) if row[m] < INF and m + 1 <= capacity])
    best = INF
    for choice in itertools.product(*options):
        end = max(s + t for s, _, t in choice)
        if any(sum(m for s, m, t in choice if s <= x < s + t) > capacity for x in range(int(end) + 1)):
            continue
        best = min(best, sum(s - r + t for (s, _, t), r in zip(choice, arrivals, strict=True)))
    return best


CASES = [
    # two perfectly parallel actions on 2 cores: one after the other at 2 cores (1 + 2) beats both at 1 (2 + 2)
    ([0, 0], [[2, 1], [2, 1]], 2),
    # three actions, 3 cores, a poorly scaling one
    ([0, 0, 1], [[4, 2, 2], [4, 2, 2], [3, 3, 3]], 3),
    # staggered arrivals, a single core for an inelastic command
    ([0, 1, 1], [[6, 3, 2], [2], [4, 2, INF]], 3),
    # capacity never binds: the bound is the ideal
    ([0, 5], [[2, 1], [2, 1]], 4),
]


@pytest.mark.parametrize("arrivals,rows,capacity", CASES)
def test_bound_is_between_the_ideal_and_the_brute_force_optimum(arrivals: list[int], rows: list[list[float]], capacity: int) -> None:
    inst = BoundInstance.of(arrivals, rows, capacity)
    result = capacity_bound(inst, bin_s=0.25, iterations=300, window_bins=24)
    optimum = brute_force(arrivals, rows, capacity)
    ideal = sum(min(t for t in row[:capacity] if t < INF) for row in rows)
    assert result.ideal_mean_s * len(rows) == pytest.approx(ideal)
    assert ideal - 1e-9 <= result.total_s <= optimum + 1e-9


def test_bound_rises_above_the_ideal_when_cores_bind() -> None:
    # Case 1: ideal 2, optimum 3; the relaxation must see most of the difference.
    inst = BoundInstance.of([0, 0], [[2, 1], [2, 1]], 2)
    result = capacity_bound(inst, bin_s=0.25, iterations=300)
    assert result.total_s > 2.9


def test_bound_equals_the_ideal_with_room_to_spare() -> None:
    inst = BoundInstance.of([0, 0, 0], [amdahl_row(8.0, 0.1, 1, 4)] * 3, 12, overhead_s=0.5)
    result = capacity_bound(inst)
    assert result.total_s == pytest.approx(3 * (0.5 + 8.0 * (0.1 + 0.9 / 4)))


def test_no_action_gets_more_than_the_pool() -> None:
    inst = BoundInstance.of([0], [amdahl_row(8.0, 0.0, 1, 8)], 2)
    assert capacity_bound(inst).total_s == pytest.approx(4.0)


def test_amdahl_row_marks_dops_below_the_minimum_infeasible() -> None:
    assert amdahl_row(4.0, 0.0, 2, 4) == [INF, 2.0, 4.0 / 3, 1.0]
