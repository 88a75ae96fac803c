"""The simulator's SWE workload (``sim.workloads.swe``): GRPO groups share one set-up when
forked, every rollout runs the live rollout's seven actions after its set-up, each action
declares the live rollout's memory demand (so under per-action memory an env holds only its
footprint between actions), and the paper summary reads the swe rows (set-up left out of
ACT, as live)."""

from __future__ import annotations

import pytest

from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.topology import ClusterSpec, CpuNodeSpec
from arl_tangram.sim import paper
from arl_tangram.sim.experiments import RunSpec, execute
from arl_tangram.sim.platform import TANGRAM
from arl_tangram.sim.runner import Simulation
from arl_tangram.sim.workloads.swe import GIB, KINDS, SweParams, swe_workload


def _setups(p: SweParams) -> list[float]:
    return [plan.phases[0][1].t_ori_s for plan in swe_workload(p, seed=1).trajectories]


def test_a_forked_group_pays_one_setup_plus_its_forks_over_g() -> None:
    own, forked = SweParams(batch=64, sigma=0.0), SweParams(batch=64, sigma=0.0, fork=True)
    assert _setups(own) == pytest.approx([own.setup_mean_s] * 64)
    share = (forked.setup_mean_s + (forked.group_size - 1) * forked.fork_s) / forked.group_size
    assert _setups(forked) == pytest.approx([share] * 64)


def test_every_rollout_is_a_setup_then_the_live_rollouts_actions() -> None:
    plans = swe_workload(SweParams(batch=8), seed=2).trajectories
    for plan in plans:
        assert [t.kind for _, t in plan.phases] == ["setup", *(k for k, _ in KINDS)]
        assert plan.phases[0][1].category == "setup" and plan.phases[-1][1].category == "reward"


def test_paper_summary_compares_tangram_with_each_pod_sizing_without_setup() -> None:
    wp = {"batch": 16, "group_size": 8}
    rows = [
        execute(RunSpec("swe", "arl-tangram", "swe", {**wp, "fork": True}, "elastic", cpu_nodes=1, cores_per_node=16)),
        execute(RunSpec("swe", "k8s-spec", "swe", wp, "k8s-static", {"pod_millicores": 1000}, "k8s", cpu_nodes=1, cores_per_node=16)),
    ]
    assert all(r["rejected"] == 0 for r in rows)
    s = paper.swe_summary(rows)
    assert set(s["swe_act_gain_vs"]) == {"k8s-spec"} and s["swe_act_gain_vs"]["k8s-spec"] > 0
    assert s["swe_step_gain_vs"]["k8s-spec"] > 0
    assert paper.swe_summary(rows[1:]) == {}


def _memory_bound_act_s(p: SweParams) -> float:
    """Mean ACT (set-up out) of a batch of 16 on one 16-core node with 3 GiB, elastic."""
    workload = swe_workload(p, seed=3)
    cluster = ClusterSpec((CpuNodeSpec("n0", (16,), 3 * GIB),), (), (), {})
    result = Simulation(cluster, make_policy("elastic"), TANGRAM, workload, seed=3, check=True).run()
    done = [r for r in result.metrics.done() if r.category != "setup"]
    assert len(done) == 16 * len(KINDS)
    return sum(r.act_s for r in done) / len(done)


def test_actions_declare_the_live_grants_and_an_env_holds_only_its_footprint_between_them() -> None:
    p = SweParams(batch=16, env_mem_bytes=1 * GIB, fork=True)
    plan = swe_workload(p, seed=1).trajectories[0]
    grants = {t.kind: t.memory_bytes for _, t in plan.phases}
    assert grants["profile"] == p.spike_grant_bytes and grants["setup"] == p.setup_grant_bytes
    assert {grants[k] for k in ("read", "grep", "test_subset", "lint", "test", "reward")} == {p.action_grant_bytes}
    # 3 GiB for 16 envs of a 1 GiB limit: charged the limit per action (nothing declared),
    # two actions run at once; charged their grants (and envs their footprints), the node's
    # 16 cores serve many more, so actions wait far less for memory
    undeclared = SweParams(batch=16, env_mem_bytes=1 * GIB, fork=True, setup_grant_bytes=GIB, spike_grant_bytes=GIB, action_grant_bytes=GIB)
    assert _memory_bound_act_s(p) < 0.7 * _memory_bound_act_s(undeclared)
