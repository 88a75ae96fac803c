"""The CPU queue's short-first order (``core.policies.short_first``): a short action passes
long ones that arrived with it, sizes learned per kind, aging still serves the oldest first,
and the tenants' fair-share interleaving is kept. Each test also runs with the order
switched off (``short_first_slowdown=0``, FCFS) and must then see the other outcome."""

from __future__ import annotations

import pytest

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import ActionFinished, ActionSubmitted
from arl_tangram.core.policies import short_first
from arl_tangram.core.policies.elastic import ElasticPolicy
from arl_tangram.core.state import QueuedAction, StateEditor
from tests.core.builders import Driver, make_action, make_cluster, make_env


def _one_core(slowdown: float | None, envs: int = 4) -> Driver:
    """A 1-core node under elastic (``slowdown`` None: the default order) with envs e0.. ready."""
    params = {} if slowdown is None else {"short_first_slowdown": slowdown}
    d = Driver.of("elastic", make_cluster(cores=1, numa=1), **params)
    for i in range(envs):
        d.add_ready_env(make_env(f"e{i}"))
    return d


def _one_core_busy(slowdown: float | None) -> Driver:
    """``_one_core`` with its core held by an action "x" on env e0."""
    d = _one_core(slowdown)
    d.step([_submit(make_action("x", env="e0", t_ori_s=1.0))], now=0.0)
    assert "x" in d.state.running
    return d


def _submit(spec: ActionSpec) -> ActionSubmitted:
    return ActionSubmitted(spec)


@pytest.mark.parametrize(("slowdown", "first"), [(None, "c"), (0.0, "a")])
def test_a_short_action_passes_long_ones_that_arrived_with_it(slowdown: float | None, first: str) -> None:
    d = _one_core_busy(slowdown)
    d.step([_submit(make_action("a", env="e1", t_ori_s=2.0))], now=0.1)
    d.step([_submit(make_action("b", env="e2", t_ori_s=2.0))], now=0.2)
    d.step([_submit(make_action("c", env="e3", t_ori_s=0.05))], now=0.3)
    r = d.finish("x", now=1.0)
    assert list(d.starts(r.decisions)) == [first]


@pytest.mark.parametrize(("slowdown", "first"), [(None, "lint-2"), (0.0, "profile-2")])
def test_sizes_are_learned_per_kind_when_the_client_gives_none(slowdown: float | None, first: str) -> None:
    d = _one_core(slowdown, envs=3)
    # one finished run of each kind teaches the core: "profile" 0.5 s, "lint" 0.01 s
    d.step([_submit(make_action("profile-1", kind="profile", env="e1", t_ori_s=None))], now=0.0)
    d.step([ActionFinished("profile-1", exec_s=0.5)], now=0.5)
    d.step([_submit(make_action("lint-1", kind="lint", env="e1", t_ori_s=None))], now=0.6)
    d.step([ActionFinished("lint-1", exec_s=0.01)], now=0.61)
    d.step([_submit(make_action("y", env="e0", t_ori_s=1.0))], now=0.7)  # holds the core
    d.step([_submit(make_action("profile-2", kind="profile", env="e1", t_ori_s=None))], now=0.8)
    d.step([_submit(make_action("lint-2", kind="lint", env="e2", t_ori_s=None))], now=0.9)
    r = d.finish("y", now=2.0)
    assert list(d.starts(r.decisions)) == [first]


def test_a_kind_never_seen_is_expected_short() -> None:
    d = _one_core_busy(None)
    d.step([_submit(make_action("known-long", env="e1", t_ori_s=3.0))], now=0.1)
    d.step([_submit(make_action("new", kind="never-seen", env="e2", t_ori_s=None))], now=0.2)
    r = d.finish("x", now=1.0)
    assert list(d.starts(r.decisions)) == ["new"]


def test_an_action_past_the_aging_bound_goes_before_a_short_newcomer() -> None:
    d = _one_core_busy(None)
    d.step([_submit(make_action("long", env="e1", t_ori_s=2.0))], now=0.1)
    d.step([_submit(make_action("short", env="e2", t_ori_s=0.01))], now=10.5)
    # "long" has waited 10.4 s > aging_s (10 s): due at its arrival, ahead of "short"
    r = d.finish("x", now=10.6)
    assert list(d.starts(r.decisions)) == ["long"]
    # without aging it would have lost: due 0.1 + 30 x 2 = 60.1 against 10.5 + 0.3
    assert 0.1 + 30 * 2.0 > 10.5 + 30 * 0.01


def test_the_order_keeps_each_tenants_places_in_the_fair_share_walk() -> None:
    d = Driver.of("elastic", make_cluster(cores=1, numa=1))
    window = [
        QueuedAction(make_action("a-long", env="e", tenant="a", t_ori_s=5.0), 0.0, 1),
        QueuedAction(make_action("b-long", env="e", tenant="b", t_ori_s=5.0), 0.0, 2),
        QueuedAction(make_action("a-short", env="e", tenant="a", t_ori_s=0.1), 0.1, 3),
        QueuedAction(make_action("b-short", env="e", tenant="b", t_ori_s=0.1), 0.1, 4),
    ]
    ed = StateEditor(d.state, 0.2)
    ordered = [qa.spec.action_id for qa in short_first.by_due_time(ed, window, 30.0, 10.0)]
    assert ordered == ["a-short", "b-short", "a-long", "b-long"]  # tenants still alternate a, b, a, b
    fcfs = [qa.spec.action_id for qa in short_first.by_due_time(ed, window, 0.0, 10.0)]
    assert fcfs == ["a-long", "b-long", "a-short", "b-short"]


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "30", True])
def test_a_bad_slowdown_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(SpecError, match="short_first_slowdown"):
        ElasticPolicy(short_first_slowdown=bad)  # type: ignore[arg-type]
