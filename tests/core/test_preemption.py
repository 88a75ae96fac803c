"""Preemption and deadlines in the core (``core.preemption``): an overdue single-core action
gives its cores back to waiting work, keeps its memory, is never charged them again; an
action that can no longer start in time ends ``rejected`` / ``deadline:``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from arl_tangram.core.decisions import PreemptAction, RejectAction
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import ActionFinished, ActionSubmitted
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.preemption import QUANTUM_FLOOR_S
from tests.core.builders import Driver, make_action, make_cluster, make_env, of_type


def _two_core_driver(**params: float) -> Driver:
    d = Driver.of("elastic", make_cluster(cores=2, numa=1), **params)
    for i in range(4):
        d.add_ready_env(make_env(f"e{i}"))
    return d


def test_an_overdue_action_yields_its_core_to_waiting_work_and_keeps_its_memory() -> None:
    d = _two_core_driver(preempt_quantum_s=0.5)
    d.step([ActionSubmitted(make_action(f"a{i}", env=f"e{i}", t_ori_s=None)) for i in range(3)], now=0.0)
    assert sorted(d.starts()) == ["a0", "a1"]
    assert d.wake_at == pytest.approx(0.5)  # a kind never seen: the cap is its first quantum
    d.step(now=0.5)
    preempted = of_type(d.log, PreemptAction)
    assert [p.action_id for p in preempted] == ["a0"]  # oldest start first, only as many as needed
    assert "a2" in d.starts()
    run = d.state.running["a0"]
    assert run.grant.cpu_millicores == 0 and run.pause_cause == "preempted" and run.paused_since_s == 0.5
    # its finish frees only what it still holds: the node's accounting stays whole
    d.step([ActionFinished("a0", "succeeded", 1.0), ActionFinished("a1", "succeeded", 1.0), ActionFinished("a2", "succeeded", 1.0)], now=2.0)
    assert d.state.cpu["cpu-0"].free_millicores == 2000


def test_without_preemption_the_third_action_waits() -> None:
    d = _two_core_driver()
    d.step([ActionSubmitted(make_action(f"a{i}", env=f"e{i}", t_ori_s=10.0)) for i in range(3)], now=0.0)
    d.step(now=5.0)
    assert not of_type(d.log, PreemptAction) and "a2" not in d.starts()


def test_nothing_is_preempted_when_nothing_waits_and_elastic_actions_keep_their_grant() -> None:
    d = _two_core_driver(preempt_quantum_s=0.5)
    d.step([ActionSubmitted(make_action("a0", env="e0", t_ori_s=10.0))], now=0.0)
    d.step(now=3.0)
    assert not of_type(d.log, PreemptAction)
    wide = make_action("w", env="e1", dop_min=1, dop_max=2, serial_fraction=0.0, t_ori_s=10.0)
    d.finish("a0", now=3.0)
    d.step([ActionSubmitted(wide)], now=3.0)
    d.step([ActionSubmitted(make_action("b", env="e2"))], now=4.0)
    d.step(now=9.0)
    assert not of_type(d.log, PreemptAction)


def test_an_action_that_cannot_start_in_time_ends_rejected_deadline() -> None:
    d = _two_core_driver()
    late = replace(make_action("late", env="e2"), timeout_s=3.0, deadline_s=5.0)
    d.step([ActionSubmitted(make_action(f"a{i}", env=f"e{i}", t_ori_s=10.0)) for i in range(2)], now=0.0)
    d.step([ActionSubmitted(late)], now=0.0)
    assert d.wake_at == pytest.approx(2.0)  # it must start by 5 - 3 s
    d.step(now=2.0)
    rejected = {r.action_id: r for r in of_type(d.log, RejectAction)}
    assert rejected["late"].outcome == "rejected" and rejected["late"].reason.startswith("deadline:")
    assert "late" not in d.starts()


def test_bad_quantum_and_deadline_name_the_field() -> None:
    with pytest.raises(SpecError, match="preempt_quantum_s"):
        make_policy("elastic", preempt_quantum_s=0.0)
    with pytest.raises(SpecError, match="deadline_s"):
        replace(make_action("a"), deadline_s=-1.0)


def test_the_first_quantum_follows_the_kinds_expected_length() -> None:
    d = _two_core_driver(preempt_quantum_s=0.5)  # the cap; a short kind's quantum is 2 x its T_ori
    d.step([ActionSubmitted(make_action(f"a{i}", env=f"e{i}", t_ori_s=0.05)) for i in range(3)], now=0.0)
    assert d.wake_at == pytest.approx(0.1)
    d.step(now=0.1)
    assert [p.action_id for p in of_type(d.log, PreemptAction)] == ["a0"] and "a2" in d.starts()


def test_an_action_declared_longer_than_the_cap_is_demoted_at_the_floor_quantum() -> None:
    # known long (the SandboxFusion face declares a program seen looping): its exclusive time
    # until the cap would only delay the short run waiting behind it
    d = _two_core_driver(preempt_quantum_s=0.5)
    d.step([ActionSubmitted(make_action("long", env="e0", t_ori_s=3.0)), ActionSubmitted(make_action("unknown", env="e1", t_ori_s=None))], now=0.0)
    d.step([ActionSubmitted(make_action("short", env="e2", t_ori_s=0.1))], now=0.0)
    assert d.wake_at == pytest.approx(QUANTUM_FLOOR_S)
    d.step(now=QUANTUM_FLOOR_S)
    assert [p.action_id for p in of_type(d.log, PreemptAction)] == ["long"] and "short" in d.starts()
    d.step([ActionSubmitted(make_action("next", env="e3", t_ori_s=0.1))], now=0.1)
    assert len(of_type(d.log, PreemptAction)) == 1  # the unknown one keeps its core until the cap
    d.step(now=0.5)
    assert [(p.action_id, p.known_long) for p in of_type(d.log, PreemptAction)] == [("long", True), ("unknown", False)]
