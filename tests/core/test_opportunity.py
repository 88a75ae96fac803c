"""The opportunity cost of cores (core/policies/opportunity.py): the efficiency knee that
floors every cap, the look-ahead cap's inputs, and the ready-env memo's correctness."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from arl_tangram.core import env_flow
from arl_tangram.core.elasticity import Amdahl
from arl_tangram.core.events import ActionSubmitted
from arl_tangram.core.policies import opportunity
from arl_tangram.core.policies.cpu_round import claim_of
from arl_tangram.core.state import QueuedAction, StateEditor
from tests.core.builders import Driver, make_action, make_cluster, make_env, make_state


@pytest.mark.parametrize(
    ("serial", "dop_min", "dop_max", "knee"),
    [
        (0.04, 1, 32, 3),  # E(3) = 1/1.08 = 0.93, E(4) = 1/1.12 = 0.89
        (0.0, 1, 32, 32),  # perfectly parallel: every core is fully used
        (0.5, 1, 16, 1),  # E(2) = 0.67 already
        (0.5, 2, 16, 2),  # never below the minimum
        (0.04, 1, 2, 2),  # never above the maximum
    ],
)
def test_knee_is_the_widest_dop_at_ninety_percent_efficiency(serial: float, dop_min: int, dop_max: int, knee: int) -> None:
    assert opportunity.knee(Amdahl(serial), dop_min, dop_max) == knee


def test_a_cap_never_narrows_a_claim_below_its_knee() -> None:
    ed = StateEditor(make_state(), 0.0)
    qa = QueuedAction(make_action("a", env="e0", dop_max=32, serial_fraction=0.04, t_ori_s=10.0), 0.0, 0)
    assert claim_of(ed, qa, cap=1).dop_max == 3  # narrower saves the pool < 10% of a core per core
    assert claim_of(ed, qa, cap=10).dop_max == 10
    assert claim_of(ed, qa).dop_max == 32
    poor = QueuedAction(make_action("b", env="e0", dop_max=32, serial_fraction=0.5, t_ori_s=10.0), 0.0, 1)
    assert claim_of(ed, poor, cap=1).dop_max == 1


def test_no_cap_without_idle_envs_or_without_elastic_runs() -> None:
    d = Driver.of("elastic", make_cluster(cores=16))
    for i in range(2):
        d.add_ready_env(make_env(f"e{i}"))
    # Only commands run: no elastic rate to look ahead with, so the test run is not capped.
    d.step([ActionSubmitted(make_action("c", env="e0", t_ori_s=5.0))])
    r = d.step([ActionSubmitted(make_action("t", env="e1", dop_max=16, serial_fraction=0.04, t_ori_s=8.0))], now=0.5)
    (start,) = [x for x in r.decisions if getattr(x, "action_id", None) == "t"]
    assert start.dop == 15 and "capped" not in start.reason


def test_ready_env_counts_follow_env_changes_and_never_keep_a_written_table() -> None:
    d = Driver.of("elastic", make_cluster(cores=16))
    d.add_ready_env(make_env("e0"))
    d.add_ready_env(make_env("e1"))
    node = d.state.envs["e0"].node_id
    assert node is not None
    assert opportunity.ready_envs_per_node(StateEditor(d.state, 1.0)) == {node: 2}
    ed = StateEditor(d.state, 1.0)
    ed.w("envs")["e1"] = replace(ed.envs["e1"], ready=False)  # a table written this round
    assert opportunity.ready_envs_per_node(ed) == {node: 1}
    ed.w("envs")["e0"] = replace(ed.envs["e0"], ready=False)  # ... may change again
    assert opportunity.ready_envs_per_node(ed) == {}
    d.add_ready_env(make_env("e2"))
    assert opportunity.ready_envs_per_node(StateEditor(d.state, 2.0)) == {node: 3}


def test_an_overdue_run_releases_its_cores_now_not_in_the_past() -> None:
    """a2 and a3 (DoP 4, expected end 5) still run at t=20; 8 cores are free. They count as
    ending now: 16 H core-seconds in a run of H = 4 + 4/m. Arrivals: 0.4/s (two runs of 5 s)
    from 5 idle envs, all here, charged half a Poisson deviation above their mean
    (``ARRIVAL_Z``). m = 7 fits (72.1 <= 73.1), m = 8 does not (80.5 > 72.0).
    Counted from their expected end, each would bring 15 s of cores it never had, and the
    newcomer would take all 8 free cores (the sigma x 2 sweep setting lost 4% that way)."""
    d = Driver.of("elastic", make_cluster(cores=16))
    for i in range(8):
        d.add_ready_env(make_env(f"e{i}"))
    d.step([ActionSubmitted(make_action(f"a{i}", env=f"e{i}", dop_max=16, serial_fraction=0.5, t_ori_s=8.0)) for i in range(4)])
    d.finish("a0", "a1", now=1.0)
    r = d.step([ActionSubmitted(make_action("late", env="e4", dop_max=16, serial_fraction=0.5, t_ori_s=8.0))], now=20.0)
    (start,) = [x for x in r.decisions if getattr(x, "action_id", None) == "late"]
    assert start.dop == 7


def _after_a_round_of_commands(envs: int, cores: int, think_s: float) -> Driver:
    """``envs`` ready envs at t=0 on one node of ``cores``; each submits a one-core command
    after ``think_s`` (its think gap) and it finishes 0.5 s later: nothing runs after."""
    d = Driver.of("elastic", make_cluster(cores=cores, numa=1))
    for i in range(envs):
        d.add_ready_env(make_env(f"e{i}"))
    d.step([ActionSubmitted(make_action(f"c{i}", kind="lint", env=f"e{i}", t_ori_s=0.5)) for i in range(envs)], now=think_s)
    d.finish(*(f"c{i}" for i in range(envs)), now=think_s + 0.5)
    return d


def test_env_submissions_teach_the_rate_per_idle_env_the_elastic_share_and_command_size() -> None:
    d = _after_a_round_of_commands(envs=8, cores=8, think_s=2.0)
    flow = env_flow.learned(StateEditor(d.state, d.now))
    assert flow is not None
    # 8 envs idle for 2 s, then 8 submissions: 0.5 per idle env-second (a 2 s think), decayed alike
    assert flow.per_idle_env == pytest.approx(0.5, rel=0.02)
    assert flow.elastic_share == 0.0 and flow.command_core_s == pytest.approx(0.5)  # one core for 0.5 s
    d.step([ActionSubmitted(make_action("t", env="e0", dop_max=8, serial_fraction=0.04, t_ori_s=4.0))], now=5.5)
    later = env_flow.learned(StateEditor(d.state, d.now))
    # the first 8 submissions and 16 idle env-seconds have decayed for 3.5 s; since 2.5 s
    # 8 envs were idle 3 s each, and one submitted: the rate falls, the elastic share rises
    kept = math.exp(-3.5 / env_flow.FLOW_TAU_S)
    assert later is not None and later.elastic_share == pytest.approx(1 / (8 * kept + 1))
    assert later.per_idle_env == pytest.approx((8 * kept + 1) / (16 * kept + 8 * 3.0))


def test_in_a_lull_the_learned_flow_caps_a_test_run_that_would_take_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing runs, 8 envs think ~1 s between actions: a test run arriving now is capped
    for the arrivals expected during it; without the learned flow it took all 8 cores."""

    def test_run_dop() -> tuple[int, str]:
        d = _after_a_round_of_commands(envs=8, cores=8, think_s=1.0)
        r = d.step([ActionSubmitted(make_action("t", env="e0", dop_max=8, serial_fraction=0.04, t_ori_s=4.0))], now=2.0)
        (start,) = [x for x in r.decisions if getattr(x, "action_id", None) == "t"]
        return start.dop, start.reason

    dop, reason = test_run_dop()
    assert dop < 8 and "capped" in reason
    monkeypatch.setattr(env_flow, "learned", lambda ed: None)
    dop, reason = test_run_dop()
    assert dop == 8 and "capped" not in reason
