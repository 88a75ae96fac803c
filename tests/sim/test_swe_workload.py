"""The simulator's SWE workload (``sim.workloads.swe``): GRPO groups share one set-up when
forked, every rollout runs the live rollout's seven actions after its set-up, and the paper
summary reads the swe rows (set-up left out of ACT, as live)."""

from __future__ import annotations

import pytest

from arl_tangram.sim import paper
from arl_tangram.sim.experiments import RunSpec, execute
from arl_tangram.sim.workloads.swe import KINDS, SweParams, swe_workload


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
