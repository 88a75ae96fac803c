"""Literal-input tests of the allocation maths: water-filling, the DP, the completion-time
heap objective, greedy eviction, and aligned GPU chunks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.core.chunks import best_chunk, chunk_mask, free_chunks, largest_free_chunk
from arl_tangram.core.elasticity import Amdahl, Table
from arl_tangram.core.policies.eviction import estimate_objective, plan_pool
from arl_tangram.core.policies.waterfill import Claim, allocate, dp_allocate, waterfill


def amdahl_claim(t_ori: float, serial: float, lo: int = 1, hi: int = 8, cost: int = 1) -> Claim:
    model = Amdahl(serial)
    return Claim.of(lo, hi, cost, lambda m: model.duration_s(t_ori, m))


def table_claim(durations: tuple[float, ...], lo: int = 1, cost: int = 1) -> Claim:
    """A claim with literal durations T(lo), T(lo+1), ..."""
    return Claim.of(lo, lo + len(durations) - 1, cost, lambda m: durations[m - lo])


def total(claims: list[Claim], dops: list[int]) -> float:
    return sum(c.duration(m) for c, m in zip(claims, dops, strict=True))


# --- Claim ----------------------------------------------------------------------------


def test_claim_of_tabulates_durations_and_detects_convexity() -> None:
    c = amdahl_claim(12.0, 0.0, 1, 4)
    assert c.durations == pytest.approx((12.0, 6.0, 4.0, 3.0))
    assert c.duration(3) == pytest.approx(4.0)
    assert c.convex
    bumpy = Table((1.0, 0.5, 1.0, 1.0))  # speedups 1, 1, 3, 4
    nc = Claim.of(1, 4, 1, lambda m: bumpy.duration_s(12.0, m))
    assert nc.durations == pytest.approx((12.0, 12.0, 4.0, 3.0))
    assert not nc.convex


# --- water-filling ----------------------------------------------------------------------


def test_waterfill_two_amdahl_claims_exact() -> None:
    # T_a = 10/m, T_b = 2/m; 4 units. Marginal gains: a 1->2 = 5, a 2->3 = 1.67, b 1->2 = 1.
    a, b = amdahl_claim(10.0, 0.0, 1, 4), amdahl_claim(2.0, 0.0, 1, 4)
    assert waterfill([a, b], 4) == [3, 1]
    assert waterfill([a, b], 5) == [3, 2]  # a 3->4 = 0.83 < b 1->2 = 1
    assert waterfill([a, b], 8) == [4, 4]  # capped at dop_max, spare left over
    assert waterfill([a, b], 2) == [1, 1]


def test_waterfill_serial_fraction_limits_the_gain() -> None:
    # a: 8 s at s=0.5 -> T = 4 + 4/m; b: 8 s at s=0 -> T = 8/m. Gains a: 2, 0.67; b: 4, 1.33, 0.67
    a, b = amdahl_claim(8.0, 0.5, 1, 4), amdahl_claim(8.0, 0.0, 1, 4)
    assert waterfill([a, b], 4) == [2, 2]  # units: b(4), a(2); both 1->2
    assert waterfill([a, b], 5) == [2, 3]  # then b 2->3 (1.33)


def test_waterfill_ties_go_fcfs() -> None:
    a, b = amdahl_claim(6.0, 0.0, 1, 4), amdahl_claim(6.0, 0.0, 1, 4)
    assert waterfill([a, b], 3) == [2, 1]
    assert waterfill([b, a], 3) == [2, 1]
    assert waterfill([a, b, amdahl_claim(6.0, 0.0, 1, 4)], 4) == [2, 1, 1]


def test_waterfill_respects_minima_and_unit_costs() -> None:
    big_min = amdahl_claim(1.0, 0.9, 3, 8)  # hardly elastic but needs 3 units
    elastic = amdahl_claim(10.0, 0.0, 1, 8)
    assert waterfill([big_min, elastic], 4) == [3, 1]
    assert waterfill([big_min, elastic], 10) == [3, 7]
    # cost 2 per unit: pricey's 1->2 saves 5 s for 2 units (2.5/unit); cheap saves 3.3, 1.7, 1
    pricey = amdahl_claim(10.0, 0.0, 1, 4, cost=2)
    cheap = Claim.of(1, 4, 1, lambda m: (10.0, 6.7, 5.0, 4.0)[m - 1])
    assert waterfill([pricey, cheap], 3) == [1, 1]
    assert waterfill([pricey, cheap], 4) == [1, 2]
    assert waterfill([pricey, cheap], 5) == [1, 3]  # 1 unit left after cheap: pricey cannot use it
    assert waterfill([pricey, cheap], 6) == [2, 2]


def test_waterfill_never_spends_on_zero_gain() -> None:
    flat = table_claim((5.0, 5.0, 5.0))
    assert waterfill([flat], 3) == [1]


def test_allocate_uses_dp_for_non_convex_tables() -> None:
    bumpy = Table((1.0, 0.5, 1.0, 1.0))  # T(1)=T(2)=12, T(3)=4, T(4)=3 for T_ori 12
    c = Claim.of(1, 4, 1, lambda m: bumpy.duration_s(12.0, m))
    assert waterfill([c], 3) == [1]  # greedy sees no gain at 1->2 and stops
    assert dp_allocate([c], 3) == [3]
    assert allocate([c], 3) == [3]
    assert allocate([c], 4) == [4]


def test_dp_allocate_literal_non_convex() -> None:
    a = table_claim((10.0, 9.0, 2.0))  # jumps at 3 units
    b = table_claim((6.0, 3.0, 2.5))
    # budget 4 (2 spare): a=3,b=1 -> 8; a=1,b=3 -> 12.5; a=2,b=2 -> 12
    assert dp_allocate([a, b], 4) == [3, 1]
    # budget 5 (3 spare): a=3,b=2 -> 5
    assert dp_allocate([a, b], 5) == [3, 2]


def _brute_force(claims: list[Claim], budget: int) -> float:
    best = float("inf")
    for dops in itertools.product(*(range(c.dop_min, c.dop_max + 1) for c in claims)):
        if sum(m * c.unit_cost for c, m in zip(claims, dops, strict=True)) <= budget:
            best = min(best, total(claims, list(dops)))
    return best


durations_st = st.lists(st.integers(1, 40), min_size=1, max_size=5).map(lambda xs: tuple(float(x) for x in xs))
claim_st = st.builds(
    lambda d, lo, cost: table_claim(d, lo, cost), durations_st, st.integers(1, 2), st.sampled_from([1, 2, 3])
)


@settings(max_examples=80, deadline=None)
@given(claims=st.lists(claim_st, min_size=1, max_size=3), extra=st.integers(0, 10))
def test_dp_allocate_equals_brute_force(claims: list[Claim], extra: int) -> None:
    budget = sum(c.dop_min * c.unit_cost for c in claims) + extra
    dops = dp_allocate(claims, budget)
    assert all(c.dop_min <= m <= c.dop_max for c, m in zip(claims, dops, strict=True))
    assert sum(m * c.unit_cost for c, m in zip(claims, dops, strict=True)) <= budget
    assert total(claims, dops) == pytest.approx(_brute_force(claims, budget))


@settings(max_examples=60, deadline=None)
@given(
    params=st.lists(st.tuples(st.floats(0.5, 50.0), st.floats(0.0, 1.0), st.integers(1, 3), st.integers(0, 5)), min_size=1, max_size=3),
    extra=st.integers(0, 12),
)
def test_waterfill_is_optimal_on_convex_claims(params: list[tuple[float, float, int, int]], extra: int) -> None:
    claims = [amdahl_claim(t, s, lo, lo + span) for t, s, lo, span in params]
    budget = sum(c.dop_min for c in claims) + extra
    dops = allocate(claims, budget)
    assert sum(dops) <= budget
    assert total(claims, dops) == pytest.approx(_brute_force(claims, budget), rel=1e-9)


# --- completion-time heap objective -----------------------------------------------------


def test_estimate_objective_scheduled_only() -> None:
    a = amdahl_claim(4.0, 0.0, 1, 4)  # T = 4/m
    assert estimate_objective([a], [2], [], free=0, releases=[], now=10.0) == pytest.approx(2.0)


def test_estimate_objective_waiting_claim_starts_at_first_release() -> None:
    scheduled = amdahl_claim(4.0, 0.0, 1, 4)  # at dop 2: 2 s, releases 2 units at t=12
    waiting = table_claim((3.0,))  # needs 1 unit for 3 s
    # heap: (11, 1) from a running action, (12, 2) from the scheduled one; free = 0
    obj = estimate_objective([scheduled], [2], [waiting], free=0, releases=[(11.0, 1)], now=10.0)
    assert obj == pytest.approx(2.0 + (1.0 + 3.0))  # waits 1 s, runs 3 s


def test_estimate_objective_waits_for_more_units_when_that_ends_sooner() -> None:
    waiting = amdahl_claim(8.0, 0.0, 1, 4)  # T = 8/m
    # 1 unit at t=1 would end at 9; 4 units at t=3 end at 5
    obj = estimate_objective([], [], [waiting], free=0, releases=[(1.0, 1), (3.0, 3)], now=0.0)
    assert obj == pytest.approx(3.0 + 2.0)


def test_estimate_objective_fcfs_chain() -> None:
    w1, w2 = table_claim((2.0,)), table_claim((2.0,))
    # one unit free; w1 starts now (ends 2), w2 waits for it
    obj = estimate_objective([], [], [w1, w2], free=1, releases=[], now=0.0)
    assert obj == pytest.approx(2.0 + (2.0 + 2.0))


def test_estimate_objective_is_infinite_when_a_claim_never_fits() -> None:
    w = table_claim((1.0,), lo=4)
    assert estimate_objective([], [], [w], free=1, releases=[(1.0, 2)], now=0.0) == float("inf")


# --- greedy eviction ------------------------------------------------------------------


def test_plan_pool_defers_when_waiting_for_releases_is_better() -> None:
    # Two perfectly parallel 8 s actions on 8 units. Split 4/4: 2 + 2 = 4.
    # Defer the second: first runs at 8 units for 1 s, second then runs 1 s: 1 + (1 + 1) = 3.
    a, b = amdahl_claim(8.0, 0.0, 1, 8), amdahl_claim(8.0, 0.0, 1, 8)
    plan = plan_pool([a, b], 8, [], now=0.0, depth=8)
    assert plan.start == (0,)
    assert plan.dops == (8,)
    assert plan.evictions == 1
    assert plan.objective_s == pytest.approx(3.0)


def test_plan_pool_keeps_everyone_when_deferral_does_not_pay() -> None:
    # Serial fraction 0.9: T(4) = 7.4 each -> 14.8; deferring gives 7.3 + (7.3 + 7.3) = 21.9.
    a, b = amdahl_claim(8.0, 0.9, 1, 8), amdahl_claim(8.0, 0.9, 1, 8)
    plan = plan_pool([a, b], 8, [], now=0.0, depth=8)
    assert plan.start == (0, 1)
    assert plan.dops == (4, 4)
    assert plan.evictions == 0
    assert plan.objective_s == pytest.approx(2 * 8.0 * (0.9 + 0.1 / 4))


def test_plan_pool_non_elastic_candidates_all_start() -> None:
    cs = [table_claim((2.0,)) for _ in range(3)]
    plan = plan_pool(cs, 3, [], now=0.0, depth=8)
    assert plan.start == (0, 1, 2) and plan.dops == (1, 1, 1) and plan.evictions == 0


def test_plan_pool_never_defers_an_aged_candidate() -> None:
    a, b = amdahl_claim(8.0, 0.0, 1, 8), amdahl_claim(8.0, 0.0, 1, 8)
    plan = plan_pool([a, b], 8, [], now=0.0, depth=8, deferrable=[False, False])
    assert plan.start == (0, 1) and plan.evictions == 0
    plan = plan_pool([a, b], 8, [], now=0.0, depth=8, deferrable=[True, False])
    assert plan.start == (1,) and plan.dops == (8,)  # the aged one runs; the other may wait


def test_plan_pool_depth_zero_means_no_tries() -> None:
    a, b = amdahl_claim(8.0, 0.0, 1, 8), amdahl_claim(8.0, 0.0, 1, 8)
    plan = plan_pool([a, b], 8, [], now=0.0, depth=0)
    assert plan.start == (0, 1) and plan.dops == (4, 4)


def test_plan_pool_charges_the_backlog() -> None:
    # A short non-elastic candidate ahead of a queued action that did not fit: deferring the
    # candidate only delays everyone, so nothing is deferred.
    short = table_claim((1.0,))
    backlog = [table_claim((1.0,), lo=2)]
    plan = plan_pool([short], 2, [(5.0, 1)], now=0.0, depth=4, backlog=backlog)
    assert plan.start == (0,) and plan.evictions == 0
    # objective: 1 (short) + the backlog waits until short frees its unit at 1, then runs 1 s
    assert plan.objective_s == pytest.approx(1.0 + 1.0 + 1.0)


# --- aligned GPU chunks -----------------------------------------------------------------


def test_chunk_mask() -> None:
    assert chunk_mask(0, 1) == 0b1
    assert chunk_mask(4, 4) == 0b11110000
    assert chunk_mask(2, 2) == 0b1100


def test_free_chunks_are_aligned_and_free() -> None:
    assert free_chunks(0, 2, 8) == [0, 2, 4, 6]
    assert free_chunks(0b00000001, 2, 8) == [2, 4, 6]
    assert free_chunks(0b00010000, 4, 8) == [0]
    assert free_chunks(0b00000110, 4, 8) == [4]  # devices 1-2 used: block 0..3 taken, no unaligned 3..6
    assert free_chunks(0, 8, 4) == []
    assert free_chunks(0xFF, 1, 8) == []


def test_best_chunk_fills_broken_blocks_first() -> None:
    assert best_chunk(0b00000001, 1, 8) == 1  # completes the pair 0-1
    assert best_chunk(0b00000100, 2, 8) == 0  # the 4-block 0..3 is already broken
    assert best_chunk(0b00000100, 1, 8) == 3  # pair 2-3 is broken: fill device 3
    assert best_chunk(0, 4, 8) == 0  # ties: lowest offset
    assert best_chunk(0b11110000, 8, 8) is None
    assert best_chunk(0, 2, 2) == 0


@settings(max_examples=60, deadline=None)
@given(used=st.integers(0, 255), size=st.sampled_from([1, 2, 4, 8]))
def test_best_chunk_is_one_of_the_free_chunks(used: int, size: int) -> None:
    free = free_chunks(used, size, 8)
    got = best_chunk(used, size, 8)
    if not free:
        assert got is None
    else:
        assert got in free
        assert got % size == 0 and not used & chunk_mask(got, size)


def test_largest_free_chunk() -> None:
    assert largest_free_chunk(0, 8) == 8
    assert largest_free_chunk(0b00000001, 8) == 4
    assert largest_free_chunk(0b01010101, 8) == 1
    assert largest_free_chunk(0xFF, 8) == 0
