"""Each policy's behaviour on a tiny cluster, driven through ``Scheduler.step`` with literal inputs.

Every round goes through ``Driver.step``, which runs ``invariants.validate`` on the new state.
"""

from __future__ import annotations

import pytest

from arl_tangram.core.decisions import (
    EvictService,
    LoadService,
    PlaceEnv,
    RejectAction,
    StartAction,
)
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import (
    ActionCancelled,
    ActionFinished,
    ActionSubmitted,
    EnvReady,
    EnvReleased,
    EnvRequested,
    NodeLost,
)
from arl_tangram.core.memory import FOOTPRINT_PRIOR_BYTES
from arl_tangram.core.policies.registry import POLICIES, make_policy
from arl_tangram.core.resources import ZERO
from arl_tangram.core.topology import QuotaPoolSpec
from tests.core.builders import (
    GIB,
    MC,
    Driver,
    make_action,
    make_cluster,
    make_env,
    make_service,
    of_type,
)

ALL_POLICIES = ["elastic", "k8s-static", "task-pool", "fixed-dop", "ideal"]


def test_registry_names_and_unknown_policy() -> None:
    assert sorted(POLICIES) == sorted(ALL_POLICIES)
    for name in ALL_POLICIES:
        assert make_policy(name).name == name
    with pytest.raises(SpecError) as info:
        make_policy("fifo")
    assert info.value.field == "policy" and "elastic" in info.value.rule


# --- elastic --------------------------------------------------------------------------


def test_elastic_env_actions_hold_only_memory_while_idle() -> None:
    # Memory per action off (the pre-issue-21 accounting): the env holds its limit.
    d = Driver.of("elastic", make_cluster(cores=8, mem_bytes=8 * GIB), memory_per_action=False)
    r = d.step([EnvRequested(make_env("e0", mem_bytes=2 * GIB))])
    (place,) = of_type(r.decisions, PlaceEnv)
    assert place.held == ZERO.__class__(mem_bytes=2 * GIB)
    assert d.state.cpu["cpu-0"].free_millicores == 8 * MC


def test_elastic_idle_env_holds_only_its_footprint() -> None:
    # Memory per action (the default): an idle env holds its footprint prior, no cores.
    d = Driver.of("elastic", make_cluster(cores=8, mem_bytes=8 * GIB))
    r = d.step([EnvRequested(make_env("e0", mem_bytes=2 * GIB))])
    (place,) = of_type(r.decisions, PlaceEnv)
    assert place.held == ZERO.__class__(mem_bytes=FOOTPRINT_PRIOR_BYTES)
    assert d.state.cpu["cpu-0"].free_millicores == 8 * MC


def test_elastic_waits_for_env_ready() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    d.step([EnvRequested(make_env("e0"))])
    r = d.step([ActionSubmitted(make_action("a", env="e0"))])
    assert not of_type(r.decisions, StartAction)
    r = d.step([EnvReady("e0")])
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["a"]


def test_elastic_single_action_gets_the_whole_node() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    r = d.step([ActionSubmitted(make_action("a", env="e0", dop_max=16, serial_fraction=0.05, t_ori_s=8.0))])
    (start,) = of_type(r.decisions, StartAction)
    assert start.dop == 8 and start.grant.cpu_millicores == 8 * MC
    assert sum(start.numa_millicores) == 8 * MC
    run = d.state.running["a"]
    assert run.expected_end_s == pytest.approx(8.0 * (0.05 + 0.95 / 8))


def test_elastic_defers_to_let_the_first_finish_fast_then_starts_the_rest() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    d.add_ready_env(make_env("e1"))
    r = d.step([
        ActionSubmitted(make_action("a", env="e0", dop_max=8, serial_fraction=0.0, t_ori_s=8.0)),
        ActionSubmitted(make_action("b", env="e1", dop_max=8, serial_fraction=0.0, t_ori_s=8.0)),
    ])
    starts = of_type(r.decisions, StartAction)
    assert [(s.action_id, s.dop) for s in starts] == [("a", 8)]
    assert "1 deferred" in starts[0].reason
    assert "b" in d.state.queue_cpu
    r = d.finish("a", now=1.0)
    assert [(s.action_id, s.dop) for s in of_type(r.decisions, StartAction)] == [("b", 8)]


def test_elastic_shares_a_node_between_inelastic_and_elastic() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    for e in ("e0", "e1", "e2"):
        d.add_ready_env(make_env(e))
    r = d.step([
        ActionSubmitted(make_action("cmd0", env="e0", t_ori_s=1.0)),
        ActionSubmitted(make_action("cmd1", env="e1", t_ori_s=1.0)),
        ActionSubmitted(make_action("test", env="e2", dop_max=16, serial_fraction=0.5, t_ori_s=4.0)),
    ])
    dops = {s.action_id: s.dop for s in of_type(r.decisions, StartAction)}
    # T(m) = 2 + 2/m keeps improving: the test run takes every core the commands leave
    assert dops == {"cmd0": 1, "cmd1": 1, "test": 6}
    assert d.state.cpu["cpu-0"].free_millicores == 0


def test_k8s_pod_runs_one_action_at_a_time() -> None:
    d = Driver.of("k8s-static", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    r = d.step([ActionSubmitted(make_action("a", env="e0")), ActionSubmitted(make_action("b", env="e0"))])
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["a"]
    assert d.state.env_busy["e0"] == ("a",)
    r = d.finish("a", now=1.0)
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["b"]


def test_elastic_gpu_restore_then_resident_then_evict() -> None:
    services = {"s1": make_service("s1", devices_max=4), "s2": make_service("s2", devices_max=4)}
    d = Driver.of("elastic", make_cluster(cpu_nodes=0, gpu_nodes=1, services=services))
    r = d.step([ActionSubmitted(make_action("g1", service="s1", dop_max=4))])
    (load,) = of_type(r.decisions, LoadService)
    (start,) = of_type(r.decisions, StartAction)
    assert load.service == "s1" and load.size == 4 and load.offset % load.size == 0
    assert start.replica_id == load.replica_id and start.dop == 4
    assert r.decisions.index(load) < r.decisions.index(start)  # load before the action on it
    d.ready_everything(now=0.5)
    d.finish("g1", now=2.0)

    # the replica stays resident: the next s1 action runs on it with no restore
    r = d.step([ActionSubmitted(make_action("g2", service="s1", dop_max=4))], now=3.0)
    assert not of_type(r.decisions, LoadService)
    (start,) = of_type(r.decisions, StartAction)
    assert start.replica_id == load.replica_id
    d.finish("g2", now=4.0)

    # two s2 actions need the whole node: the idle s1 replica is evicted for one of them
    r = d.step([ActionSubmitted(make_action(f"h{i}", service="s2", dop_max=4)) for i in range(2)], now=5.0)
    evicts = of_type(r.decisions, EvictService)
    loads = of_type(r.decisions, LoadService)
    assert [e.replica_id for e in evicts] == [load.replica_id]
    assert len(loads) == 2 and all(x.service == "s2" for x in loads)
    assert {s.action_id for s in of_type(r.decisions, StartAction)} == {"h0", "h1"}
    assert load.replica_id not in d.state.replicas
    assert d.state.gpu["gpu-0"] == 0xFF


def test_elastic_gpu_reshards_a_wide_idle_replica_under_a_backlog() -> None:
    """A TP-4 replica left idle while four requests queue is split into four TP-1 replicas."""
    services = {"s1": make_service("s1", devices_max=4)}
    d = Driver.of("elastic", make_cluster(cpu_nodes=0, gpu_nodes=1, gpus_per_node=4, services=services))
    r = d.step([ActionSubmitted(make_action("g0", service="s1", dop_max=4, t_ori_s=2.0))])
    (wide,) = of_type(r.decisions, LoadService)
    assert wide.size == 4
    d.ready_everything(now=0.5)
    d.finish("g0", now=1.0)
    r = d.step([ActionSubmitted(make_action(f"g{i}", service="s1", dop_max=4, t_ori_s=2.0)) for i in range(1, 5)], now=2.0)
    assert [e.replica_id for e in of_type(r.decisions, EvictService)] == [wide.replica_id]
    loads = of_type(r.decisions, LoadService)
    assert sorted((x.offset, x.size) for x in loads) == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert {s.action_id for s in of_type(r.decisions, StartAction)} == {"g1", "g2", "g3", "g4"}


def test_elastic_gpu_keeps_a_wide_replica_for_a_single_request() -> None:
    services = {"s1": make_service("s1", devices_max=4)}
    d = Driver.of("elastic", make_cluster(cpu_nodes=0, gpu_nodes=1, gpus_per_node=4, services=services))
    d.step([ActionSubmitted(make_action("g0", service="s1", dop_max=4))])
    d.ready_everything(now=0.5)
    d.finish("g0", now=1.0)
    r = d.step([ActionSubmitted(make_action("g1", service="s1", dop_max=4))], now=2.0)
    assert not of_type(r.decisions, EvictService) and not of_type(r.decisions, LoadService)
    (start,) = of_type(r.decisions, StartAction)
    assert start.dop == 4


def test_elastic_gpu_never_evicts_a_busy_replica() -> None:
    services = {"s1": make_service("s1", devices_min=8, devices_max=8), "s2": make_service("s2")}
    d = Driver.of("elastic", make_cluster(cpu_nodes=0, gpu_nodes=1, services=services))
    d.step([ActionSubmitted(make_action("big", service="s1", dop_min=8, dop_max=8, t_ori_s=10.0))])
    r = d.step([ActionSubmitted(make_action("small", service="s2"))], now=1.0)
    assert not of_type(r.decisions, EvictService) and not of_type(r.decisions, StartAction)
    assert "small" in d.state.queue_service
    r = d.finish("big", now=10.0)
    assert of_type(r.decisions, EvictService)
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["small"]


def test_elastic_api_actions_wait_for_tokens_and_wake() -> None:
    d = Driver.of("elastic", make_cluster(quota_pools=[QuotaPoolSpec("search", 2, 1.0)]))
    r = d.step([ActionSubmitted(make_action(f"q{i}", api="search", t_ori_s=0.5)) for i in range(4)])
    starts = of_type(r.decisions, StartAction)
    assert [s.action_id for s in starts] == ["q0", "q1"]
    assert all(s.grant.quota_tokens == 1 for s in starts)
    assert d.state.quota["search"].free_tokens == 0
    assert r.wake_at == pytest.approx(1.0)  # the bucket is empty; one token per second
    r = d.finish("q0", "q1", now=0.5)
    assert not of_type(r.decisions, StartAction)  # concurrency is back, rate is not
    assert r.wake_at == pytest.approx(1.0)
    r = d.step([], now=r.wake_at)
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["q2"]
    assert r.wake_at == pytest.approx(2.0)


def test_quota_wake_up_makes_progress() -> None:
    """The bucket refills in small increments; when the promised wake-up comes, a token must
    be there (float rounding must not leave it at 0.999... with the wake-up stuck at now)."""
    d = Driver.of("elastic", make_cluster(quota_pools=[QuotaPoolSpec("api", 1, 1.0)]))
    d.step([ActionSubmitted(make_action("q0", api="api")), ActionSubmitted(make_action("q1", api="api"))], now=0.0)
    r = d.finish("q0", now=0.0)
    assert r.wake_at == pytest.approx(1.0)
    wake = r.wake_at
    d.step([], now=0.2)  # unrelated rounds refill the bucket bit by bit
    d.step([], now=0.9)
    r = d.step([], now=wake)
    assert "q1" in d.starts(), (d.state.quota["api"], r.wake_at)


@pytest.mark.parametrize("policy", ["k8s-static", "task-pool"])
def test_baselines_do_not_manage_api_quota(policy: str) -> None:
    d = Driver.of(policy, make_cluster(quota_pools=[QuotaPoolSpec("search", 2, 1.0)]))
    r = d.step([ActionSubmitted(make_action(f"q{i}", api="search")) for i in range(5)])
    starts = of_type(r.decisions, StartAction)
    assert len(starts) == 5
    assert all(s.grant == ZERO for s in starts)
    assert d.state.quota["search"].free_tokens == 2
    assert r.wake_at is None


# --- k8s-static -----------------------------------------------------------------------


def test_k8s_static_pods_hold_cores_and_envs_queue_when_full() -> None:
    d = Driver.of("k8s-static", make_cluster(cores=8, numa=1), pod_millicores=4000)
    r = d.step([EnvRequested(make_env(f"e{i}")) for i in range(3)])
    places = of_type(r.decisions, PlaceEnv)
    assert [p.env_id for p in places] == ["e0", "e1"]
    assert all(p.held.cpu_millicores == 4000 for p in places)
    assert d.state.cpu["cpu-0"].free_millicores == 0
    assert "e2" in d.state.env_queue
    d.ready_everything()
    # pods keep their cores while idle and while running: actions take nothing more
    r = d.step([ActionSubmitted(make_action("a", env="e0", dop_max=8, serial_fraction=0.0, t_ori_s=8.0))])
    (start,) = of_type(r.decisions, StartAction)
    assert start.dop == 4 and start.grant == ZERO
    assert d.state.running["a"].expected_end_s == pytest.approx(2.0)
    d.finish("a", now=2.0)
    assert d.state.cpu["cpu-0"].free_millicores == 0
    assert "e2" in d.state.env_queue
    r = d.step([EnvReleased("e0")], now=3.0)
    assert [p.env_id for p in of_type(r.decisions, PlaceEnv)] == ["e2"]


def test_k8s_static_pod_release_returns_cores_to_their_numa_domains() -> None:
    d = Driver.of("k8s-static", make_cluster(cores=8, numa=2), pod_millicores=2000)
    d.step([EnvRequested(make_env(f"e{i}")) for i in range(3)])
    assert d.state.cpu["cpu-0"].free_millicores == 2000
    for i in range(3):
        d.step([EnvReleased(f"e{i}")], now=float(i + 1))  # validate: NUMA free within capacity
    assert d.state.cpu["cpu-0"].numa_free == (4000, 4000)


def test_k8s_static_dop_is_clamped_to_the_action() -> None:
    d = Driver.of("k8s-static", make_cluster(cores=16), pod_millicores=8000)
    d.add_ready_env(make_env("e0"))
    d.add_ready_env(make_env("e1"))
    r = d.step([
        ActionSubmitted(make_action("small", env="e0", dop_max=2, t_ori_s=1.0)),
        ActionSubmitted(make_action("cmd", env="e1", t_ori_s=1.0)),
    ])
    dops = {s.action_id: s.dop for s in of_type(r.decisions, StartAction)}
    assert dops == {"small": 2, "cmd": 1}


def test_k8s_static_dedicated_deployments_are_pinned() -> None:
    services = {"s1": make_service("s1", devices_max=4), "s2": make_service("s2", devices_max=4)}
    d = Driver.of("k8s-static", make_cluster(gpu_nodes=1, services=services), deployments={"s1": (1, 4), "s2": (1, 4)})
    loads = of_type(d.log, LoadService)
    assert sorted(x.service for x in loads) == ["s1", "s2"]
    assert all(x.cause == "bootstrap" for x in loads)
    assert all(rep.pinned for rep in d.state.replicas.values())
    d.ready_everything()
    r = d.step([ActionSubmitted(make_action(f"g{i}", service="s1", dop_max=4)) for i in range(2)])
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["g0"]
    assert not of_type(r.decisions, EvictService) and not of_type(r.decisions, LoadService)


def test_static_deployment_that_does_not_fit_raises() -> None:
    d = Driver.of("elastic", make_cluster(gpu_nodes=1, services={"s": make_service("s", devices_max=8)}))
    policy = make_policy("k8s-static", deployments={"s": (2, 8)})
    with pytest.raises(ValueError, match="no free aligned chunk"):
        Driver(policy, d.state)


# --- task-pool ------------------------------------------------------------------------


def _task_pool_driver() -> Driver:
    services = {"s1": make_service("s1", devices_max=4), "s2": make_service("s2", devices_max=4)}
    cluster = make_cluster(cpu_nodes=2, cores=8, mem_bytes=4 * GIB, gpu_nodes=1, services=services)
    return Driver.of(
        "task-pool", cluster, partitions={"A": ("cpu-0",), "B": ("cpu-1",)},
        deployments={"s1": (1, 4), "s2": (1, 4)}, dop=2,
    )


def test_task_pool_tenants_stay_in_their_partition() -> None:
    d = _task_pool_driver()
    d.step([EnvRequested(make_env(f"a{i}", mem_bytes=GIB, tenant="A")) for i in range(4)])
    d.step([EnvRequested(make_env("b0", mem_bytes=GIB, tenant="B"))])
    assert {e: env.node_id for e, env in d.state.envs.items()} == {
        "a0": "cpu-0", "a1": "cpu-0", "a2": "cpu-0", "a3": "cpu-0", "b0": "cpu-1",
    }
    # cpu-0 is full; A's next env waits although cpu-1 has room
    d.step([EnvRequested(make_env("a4", mem_bytes=GIB, tenant="A"))])
    assert "a4" in d.state.env_queue
    d.ready_everything()
    r = d.step([ActionSubmitted(make_action(f"x{i}", env=f"a{i}", dop_max=8, serial_fraction=0.0)) for i in range(4)])
    starts = of_type(r.decisions, StartAction)
    assert [(s.action_id, s.node_id, s.dop) for s in starts] == [(f"x{i}", "cpu-0", 2) for i in range(4)]


def test_task_pool_one_tenants_backlog_does_not_block_another() -> None:
    """Static pools per task are independent: B's pool has room, so B's env is placed even
    while A's env waits for A's full pool."""
    d = _task_pool_driver()
    d.step([EnvRequested(make_env(f"a{i}", mem_bytes=GIB, tenant="A")) for i in range(5)])
    assert "a4" in d.state.env_queue
    r = d.step([EnvRequested(make_env("b0", mem_bytes=GIB, tenant="B"))])
    assert [(p.env_id, p.node_id) for p in of_type(r.decisions, PlaceEnv)] == [("b0", "cpu-1")]


def test_task_pool_static_deployments_never_borrow_across_services() -> None:
    d = _task_pool_driver()
    d.ready_everything()
    s1_rep = next(r for r in d.state.replicas.values() if r.service == "s1")
    r = d.step([ActionSubmitted(make_action(f"g{i}", service="s1", dop_max=4)) for i in range(3)])
    starts = of_type(r.decisions, StartAction)
    assert [(s.action_id, s.replica_id) for s in starts] == [("g0", s1_rep.replica_id)]
    assert not of_type(r.decisions, EvictService) and not of_type(r.decisions, LoadService)
    # s2's replica stays idle although s1 has a backlog
    assert all(rep.busy_action is None for rep in d.state.replicas.values() if rep.service == "s2")
    r = d.finish("g0", now=1.0)
    assert [(s.action_id, s.replica_id) for s in of_type(r.decisions, StartAction)] == [("g1", s1_rep.replica_id)]


def test_static_replica_never_runs_an_action_wider_than_itself() -> None:
    d = _task_pool_driver()
    d.ready_everything()
    r = d.step([ActionSubmitted(make_action("wide", service="s1", dop_min=8, dop_max=8))])
    for start in of_type(r.decisions, StartAction):
        rep = d.state.replicas[start.replica_id]
        assert start.dop <= rep.size, (start, rep)


def test_static_replicas_serve_only_when_ready() -> None:
    d = _task_pool_driver()
    r = d.step([ActionSubmitted(make_action("g", service="s1"))])
    assert not of_type(r.decisions, StartAction)
    r = d.ready_everything()
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["g"]


# --- fixed-dop and ideal -------------------------------------------------------------


def test_fixed_dop_gives_exactly_k_clamped_and_never_defers() -> None:
    d = Driver.of("fixed-dop", make_cluster(cores=16), dop=4)
    envs = ["e0", "e1", "e2", "e3", "e4"]
    for e in envs:
        d.add_ready_env(make_env(e))
    r = d.step([
        ActionSubmitted(make_action("wide", env="e0", dop_max=16, serial_fraction=0.0)),
        ActionSubmitted(make_action("narrow", env="e1", dop_max=2, serial_fraction=0.0)),
        ActionSubmitted(make_action("floor", env="e2", dop_min=6, dop_max=8, serial_fraction=0.0)),
        ActionSubmitted(make_action("cmd", env="e3")),
        ActionSubmitted(make_action("late", env="e4", dop_max=16, serial_fraction=0.0)),
    ])
    dops = {s.action_id: s.dop for s in of_type(r.decisions, StartAction)}
    # 4 + 2 + 6 + 1 = 13 of 16 cores; "late" needs 4 and waits
    assert dops == {"wide": 4, "narrow": 2, "floor": 6, "cmd": 1}
    assert all(s.reason == "fixed DoP 4" for s in of_type(r.decisions, StartAction))
    r = d.finish("wide", now=1.0)
    assert {s.action_id: s.dop for s in of_type(r.decisions, StartAction)} == {"late": 4}


def test_fixed_dop_larger_than_a_node_still_runs() -> None:
    """An accepted action must not wait forever: with k above a node's cores, the action
    fits at its dop_min, so it must start (clamped to what the node holds)."""
    d = Driver.of("fixed-dop", make_cluster(cores=8), dop=16)
    d.add_ready_env(make_env("e0"))
    d.step([ActionSubmitted(make_action("a", env="e0", dop_max=32, serial_fraction=0.0))])
    d.step([], now=20.0)  # wake-ups past the aging bound
    d.step([], now=40.0)
    assert [s.action_id for s in of_type(d.log, StartAction)] == ["a"]


def test_fixed_dop_does_not_defer_where_elastic_would() -> None:
    for policy, expected in (("fixed-dop", {"a": 4, "b": 4}), ("elastic", {"a": 8})):
        d = Driver.of(policy, make_cluster(cores=8), **({"dop": 4} if policy == "fixed-dop" else {}))
        d.add_ready_env(make_env("e0"))
        d.add_ready_env(make_env("e1"))
        r = d.step([
            ActionSubmitted(make_action("a", env="e0", dop_max=8, serial_fraction=0.0, t_ori_s=8.0)),
            ActionSubmitted(make_action("b", env="e1", dop_max=8, serial_fraction=0.0, t_ori_s=8.0)),
        ])
        assert {s.action_id: s.dop for s in of_type(r.decisions, StartAction)} == expected, policy


def test_ideal_starts_everything_at_dop_max() -> None:
    services = {"s": make_service("s", devices_max=8)}
    d = Driver.of("ideal", make_cluster(cpu_nodes=2, cores=256, gpu_nodes=2, services=services))
    for i in range(6):
        d.add_ready_env(make_env(f"e{i}"))
    events = [ActionSubmitted(make_action(f"a{i}", env=f"e{i}", dop_max=8 * (i + 1), serial_fraction=0.1)) for i in range(6)]
    events += [ActionSubmitted(make_action(f"g{i}", service="s", dop_max=8)) for i in range(2)]
    r = d.step(events)
    dops = {s.action_id: s.dop for s in of_type(r.decisions, StartAction)}
    assert dops == {**{f"a{i}": 8 * (i + 1) for i in range(6)}, "g0": 8, "g1": 8}


# --- shared bookkeeping ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_cancel_a_queued_action(policy: str) -> None:
    d = Driver.of(policy, make_cluster(cores=8))
    d.step([EnvRequested(make_env("e0"))])  # never ready: its action stays queued
    d.step([ActionSubmitted(make_action("a", env="e0"))])
    assert "a" in d.state.queue_cpu
    r = d.step([ActionCancelled("a")])
    assert [(x.action_id, type(x)) for x in r.decisions] == [("a", RejectAction)]
    assert "cancelled" in r.decisions[0].reason
    assert "a" not in d.state.queued()
    r = d.step([ActionCancelled("a"), ActionFinished("nope"), EnvReleased("ghost"), EnvReady("ghost")])
    assert r.decisions == ()


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_releasing_an_env_rejects_its_queued_actions(policy: str) -> None:
    d = Driver.of(policy, make_cluster(cores=8))
    d.step([EnvRequested(make_env("e0"))])
    d.step([ActionSubmitted(make_action("a", env="e0"))])
    r = d.step([EnvReleased("e0")])
    rejects = of_type(r.decisions, RejectAction)
    assert [x.action_id for x in rejects] == ["a"] and "released" in rejects[0].reason
    assert not d.state.envs and not d.state.queued()
    assert d.state.cpu["cpu-0"].free_mem_bytes == d.state.spec.cpu_nodes[0].mem_bytes


def test_finish_returns_resources_and_is_idempotent() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    d.step([ActionSubmitted(make_action("a", env="e0", dop_max=8, serial_fraction=0.0))])
    assert d.state.cpu["cpu-0"].free_millicores == 0
    d.finish("a", now=1.0)
    d.finish("a", now=1.0)
    assert d.state.cpu["cpu-0"].free_millicores == 8 * MC
    assert d.state.cpu["cpu-0"].numa_free == (4 * MC, 4 * MC)
    assert not d.state.running


def test_finish_feeds_the_duration_estimate() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    d.step([ActionSubmitted(make_action("a", kind="unit", env="e0", t_ori_s=None))])
    d.step([ActionFinished("a", exec_s=3.0)], now=3.0)
    d.step([ActionSubmitted(make_action("b", kind="unit", env="e0", t_ori_s=None))])
    assert d.state.running["b"].expected_end_s == pytest.approx(3.0 + 3.0)
    d.step([ActionFinished("b", exec_s=5.0)], now=8.0)
    assert d.state.estimates["unit"] == (2, pytest.approx(4.0))


def test_node_lost_drops_its_envs_and_actions() -> None:
    d = Driver.of("elastic", make_cluster(cpu_nodes=2, cores=8))
    d.add_ready_env(make_env("e0"))
    d.add_ready_env(make_env("e1"))
    d.step([EnvRequested(make_env("e2"))])  # placed, never ready
    node0 = d.state.envs["e0"].node_id
    assert d.state.envs["e2"].node_id == node0 != d.state.envs["e1"].node_id
    d.step([ActionSubmitted(make_action("a", env="e0")), ActionSubmitted(make_action("b", env="e2"))])
    assert "a" in d.state.running and "b" in d.state.queue_cpu
    r = d.step([NodeLost(node0)], now=1.0)
    ended = {x.action_id: (x.outcome, x.reason.split(":")[0]) for x in of_type(r.decisions, RejectAction)}
    assert ended == {"a": ("error", "node_lost"), "b": ("error", "node_lost")}  # one outcome each, running or queued
    assert "e0" not in d.state.envs and "e2" not in d.state.envs and "a" not in d.state.running
    assert node0 not in d.state.cpu
    # the surviving node still schedules
    r = d.step([ActionSubmitted(make_action("c", env="e1"))], now=2.0)
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["c"]


def _quiet_moment(opportunity_cost: bool) -> int:
    """8 envs on a 16-core node; four test runs started at once, three finish, one new arrives.

    At t=1.5, a3 (DoP 4, expected end 5) runs; 12 cores are free. Envs return at the pool's
    completion rate, 1/5 per s, spread over 6 idle envs, all 6 on this node: 0.2 arrivals/s.
    A run at DoP m lasts H = 4 + 4/m (Amdahl 0.5, T_ori 8); the node has 12 H + 4 (H - 3.5)
    core-seconds in it. m = 7: H = 4.57, demand 7 H for the newcomer plus (0.91 + 0.5 sqrt
    0.91) arrivals (half a Poisson deviation above the mean, ``ARRIVAL_Z``) at 7 cores for
    H/2 = 54.3 <= 59.1; m = 8: 60.7 > 58.0. So 7, not all 12."""
    d = Driver.of("elastic", make_cluster(cores=16), opportunity_cost=opportunity_cost)
    for i in range(8):
        d.add_ready_env(make_env(f"e{i}"))
    r = d.step([ActionSubmitted(make_action(f"a{i}", env=f"e{i}", dop_max=16, serial_fraction=0.5, t_ori_s=8.0)) for i in range(4)])
    assert {s.action_id: s.dop for s in of_type(r.decisions, StartAction)} == {"a0": 4, "a1": 4, "a2": 4, "a3": 4}
    d.finish("a0", "a1", "a2", now=1.0)
    r = d.step([ActionSubmitted(make_action("late", env="e4", dop_max=16, serial_fraction=0.5, t_ori_s=8.0))], now=1.5)
    (start,) = of_type(r.decisions, StartAction)
    return int(start.dop)


def test_elastic_keeps_cores_for_expected_arrivals() -> None:
    assert _quiet_moment(opportunity_cost=True) == 7
    assert _quiet_moment(opportunity_cost=False) == 12


def test_elastic_without_idle_envs_lets_the_present_compete_exactly() -> None:
    # Every env is in flight: nobody else can arrive, so deferral may give one all the cores.
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    d.add_ready_env(make_env("e1"))
    r = d.step([ActionSubmitted(make_action(x, env=e, dop_max=8, serial_fraction=0.0, t_ori_s=8.0)) for x, e in (("a", "e0"), ("b", "e1"))])
    (start,) = of_type(r.decisions, StartAction)
    assert (start.action_id, start.dop) == ("a", 8) and "capped" not in start.reason


def test_one_policy_instance_serves_two_loops() -> None:
    """No per-round state on the policy: interleaving two drivers on one instance gives each
    the decisions it gets alone."""
    from arl_tangram.core.policies.elastic import FixedDopPolicy

    def run(shared: FixedDopPolicy | None) -> list[list[tuple[str, int]]]:
        out = []
        drivers = [Driver.of(shared or FixedDopPolicy(dop=16), make_cluster(cores=c)) for c in (4, 32)]
        for d in drivers:
            d.add_ready_env(make_env("e0"))
        for d in drivers:
            r = d.step([ActionSubmitted(make_action("a", env="e0", dop_max=32, serial_fraction=0.0))])
            out.append([(s.action_id, s.dop) for s in of_type(r.decisions, StartAction)])
        return out

    assert run(FixedDopPolicy(dop=16)) == [[("a", 4)], [("a", 16)]]


def test_elastic_gpu_batches_a_generating_services_actions_on_one_replica() -> None:
    """A generating service (``max_batch`` > 1) runs up to that many actions on one resident
    replica at once (they decode together) instead of restoring a replica per action; an
    action beyond the batch waits, and a replica with actions in its batch is never evicted."""
    from arl_tangram.core.action import ServiceSpec

    judge = ServiceSpec("judge", 10**9, 1, 1, kv_cache_bytes=10**8, max_batch=3)
    d = Driver.of("elastic", make_cluster(gpu_nodes=1, gpus_per_node=2, services={"judge": judge}))
    d.step([ActionSubmitted(make_action("j0", service="judge"))])
    d.ready_everything(now=1.0)
    replica = next(iter(d.state.replicas))
    r = d.step([ActionSubmitted(make_action(f"j{i}", service="judge")) for i in range(1, 5)], now=1.0)
    starts = of_type(r.decisions, StartAction)
    assert [(s.action_id, s.replica_id) for s in starts if s.replica_id == replica] == [("j1", replica), ("j2", replica)]
    assert d.state.replicas[replica].busy_actions == ("j0", "j1", "j2")
    assert not of_type(r.decisions, EvictService)
    r = d.finish("j1", now=2.0)
    joined = [s.action_id for s in of_type(r.decisions, StartAction) if s.replica_id == replica]
    assert len(joined) == 1 and d.state.replicas[replica].busy_actions[:2] == ("j0", "j2")
