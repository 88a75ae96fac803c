"""The weighted fair share between tenants (core/fair_share.py): the walk order, and the
shares of the pool that result under contention, on a virtual clock through the scheduler."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import ActionFinished, ActionSubmitted, Event
from arl_tangram.core.fair_share import share_order
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec, QuotaPoolSpec
from tests.core.builders import MC, Driver, make_action, make_cluster, make_state

POLICIES = ("elastic", "fixed-dop")


def _queue(tenants: list[str], weights: dict[str, float] | None = None) -> ClusterState:
    """A state whose CPU lane holds one 1-core action per entry of ``tenants``, in order."""
    cluster = replace(make_cluster(cores=1, numa=1), tenant_weights=weights or {})
    driver = Driver.of("fixed-dop", cluster, dop=1)
    driver.step([ActionSubmitted(make_action("blocker"))])  # holds the only core
    driver.step([ActionSubmitted(make_action(f"{t}{i}", tenant=t)) for i, t in enumerate(tenants)])
    return driver.state


def _walk(state: ClusterState) -> list[str]:
    return [qa.spec.action_id for qa in share_order(state.edit(state.now_s), "queue_cpu")]


def test_one_tenant_walks_the_lane_itself_fcfs() -> None:
    state = _queue(["a", "a", "a"])
    ed = state.edit(0.0)
    assert isinstance(share_order(ed, "queue_cpu"), type({}.values()))  # the lane itself, no copy
    assert _walk(state) == ["a0", "a1", "a2"]


def test_equal_weights_interleave_a_flood_with_a_latecomer() -> None:
    # tenant a floods the queue first; b arrives after: the walk alternates, FCFS inside each
    assert _walk(_queue(["a"] * 4 + ["b"] * 2)) == ["a0", "b4", "a1", "b5", "a2", "a3"]


def test_weights_set_the_proportions() -> None:
    order = _walk(_queue(["a"] * 6 + ["b"] * 6, {"a": 2.0}))
    assert order[:6] == ["a0", "b6", "a1", "a2", "b7", "a3"]


def test_a_tenant_that_used_more_comes_later() -> None:
    # a's action holds the only core for 10 s while c waits; then a queues two more: c's
    # action, submitted later than a's first, still goes first
    driver = Driver.of("fixed-dop", make_cluster(cores=1, numa=1), dop=1)
    driver.step([ActionSubmitted(make_action("a-held", tenant="a")), ActionSubmitted(make_action("c0", tenant="c"))], now=0.0)
    assert set(driver.state.running) == {"a-held"}
    driver.step([ActionSubmitted(make_action(f"a{i}", tenant="a")) for i in range(2)], now=10.0)
    assert _walk(driver.state) == ["c0", "a0", "a1"]


def test_weights_must_be_positive_and_finite() -> None:
    with pytest.raises(SpecError, match=r"tenant_weights\[a\]"):
        ClusterSpec(tenant_weights={"a": 0.0})
    with pytest.raises(SpecError, match=r"tenant_weights\[b\]"):
        ClusterSpec(tenant_weights={"b": float("inf")})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=30), st.dictionaries(st.sampled_from("abc"), st.sampled_from([0.5, 1.0, 3.0])))
def test_the_walk_is_a_permutation_fcfs_within_each_tenant(tenants: list[str], weights: dict[str, float]) -> None:
    order = _walk(_queue(tenants, weights))
    assert sorted(order) == sorted(f"{t}{i}" for i, t in enumerate(tenants))
    for t in set(tenants):
        mine = [int(a[1:]) for a in order if a[0] == t]
        assert mine == sorted(mine)


# -- shares under contention: a closed loop on a virtual clock ------------------------------


def _run_closed_loop(
    policy: str, weights: dict[str, float], active: dict[str, tuple[float, float]], horizon_s: float,
    *, cores: int = 8, dop_max: int = 1,
) -> tuple[dict[str, float], float]:
    """Each tenant in ``active`` keeps 12 one-second actions queued from ``active[t][0]`` to
    ``active[t][1]`` (each finished one is replaced). Returns each tenant's time-averaged
    held cores over the second half of the horizon, and the pool's average utilisation."""
    cluster = replace(make_cluster(cores=cores), tenant_weights=weights)
    params = {"dop": 1} if policy == "fixed-dop" else {}
    driver = Driver(make_policy(policy, **params), make_state(cluster))
    ids = itertools.count()
    timers: list[tuple[float, int, Event]] = []

    def submit(tenant: str, at: float) -> None:
        n = next(ids)
        spec = make_action(f"{tenant}-{n}", tenant=tenant, dop_max=dop_max, serial_fraction=0.05 if dop_max > 1 else None)
        heapq.heappush(timers, (at, n, ActionSubmitted(spec)))

    for tenant, (start, _) in sorted(active.items()):
        for _ in range(12):
            submit(tenant, start)
    held_s: dict[str, float] = defaultdict(float)
    running: dict[str, tuple[str, int]] = {}
    now = 0.0
    while timers and now < horizon_s:
        at, _, event = heapq.heappop(timers)
        if at >= horizon_s / 2:
            span = min(at, horizon_s) - max(now, horizon_s / 2)
            for tenant, millicores in running.values():
                held_s[tenant] += span * millicores / MC
        now = at
        result = driver.step([event], now)
        if isinstance(event, ActionFinished):
            tenant, _ = running.pop(event.action_id)
            if active[tenant][1] > now:
                submit(tenant, now)
        for d in driver.starts(result.decisions).values():
            run = driver.state.running[d.action_id]
            running[d.action_id] = (run.spec.tenant, d.grant.cpu_millicores)
            heapq.heappush(timers, (run.expected_end_s, next(ids), ActionFinished(d.action_id, exec_s=run.expected_end_s - now)))
    window = horizon_s / 2
    shares = {t: held_s[t] / window for t in active}
    return shares, sum(shares.values()) / cores


@pytest.mark.parametrize("policy", POLICIES)
def test_contended_pool_is_shared_by_weight(policy: str) -> None:
    shares, used = _run_closed_loop(policy, {"a": 3.0, "b": 1.0}, {"a": (0.0, 1e9), "b": (0.0, 1e9)}, 60.0)
    assert shares["a"] == pytest.approx(6.0, abs=0.6) and shares["b"] == pytest.approx(2.0, abs=0.6)
    assert used == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("policy", POLICIES)
def test_an_idle_tenants_share_is_lent_not_lost(policy: str) -> None:
    # c weighs most but queues nothing: a and b use the whole pool, 1:1 between them
    shares, used = _run_closed_loop(policy, {"a": 1.0, "b": 1.0, "c": 4.0}, {"a": (0.0, 1e9), "b": (0.0, 1e9)}, 60.0)
    assert used == pytest.approx(1.0, abs=0.02)
    assert shares["a"] == pytest.approx(4.0, abs=0.6) and shares["b"] == pytest.approx(4.0, abs=0.6)


def test_a_latecomer_gets_its_share_within_a_bounded_time() -> None:
    # a floods from t=0; b arrives at t=20 and must hold its half for the second half
    shares, _ = _run_closed_loop("fixed-dop", {}, {"a": (0.0, 1e9), "b": (20.0, 1e9)}, 80.0)
    assert shares["b"] == pytest.approx(4.0, abs=0.6)


def test_elastic_grants_keep_the_weighted_share_within_a_bound() -> None:
    # elastic actions may take spare cores beyond their share, but the order favours the
    # tenant below its share, so over time the weights still hold (a looser bound)
    shares, used = _run_closed_loop("elastic", {"a": 3.0, "b": 1.0}, {"a": (0.0, 1e9), "b": (0.0, 1e9)}, 60.0, dop_max=4)
    assert used > 0.9
    assert shares["a"] / (shares["a"] + shares["b"]) == pytest.approx(0.75, abs=0.1)


def test_api_slots_alternate_between_tenants_under_contention() -> None:
    cluster = make_cluster(quota_pools=[QuotaPoolSpec("search", max_concurrency=2, rate_per_s=1000.0)])
    driver = Driver.of("elastic", cluster)
    flood = [make_action(f"a{i}", api="search", tenant="a") for i in range(6)]
    late = [make_action(f"b{i}", api="search", tenant="b") for i in range(2)]
    driver.step([ActionSubmitted(s) for s in flood], now=0.0)
    driver.step([ActionSubmitted(s) for s in late], now=0.1)
    started: list[str] = []
    for i in range(4):
        running = sorted(driver.state.running)
        started += [a for a in running if a not in started]
        driver.finish(*running, now=1.0 + i)
    assert started[:2] == ["a0", "a1"]  # b was not there yet
    assert set(started[2:4]) == {"a2", "b0"} and set(started[4:6]) == {"a3", "b1"}
