"""CPU packing (``core.packing``): single-core env actions of a kind measured to leave its
core mostly idle are charged their measured use, so several share a cpu; the cgroup's limit
stays their whole demand. Each test that expects packing also runs with it switched off
(``cpu_packing=False``) and must then see exclusive grants."""

from __future__ import annotations

import pytest

from arl_tangram.core import packing
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import ActionFinished, ActionSubmitted
from arl_tangram.core.invariants import validate
from tests.core.builders import Driver, make_action, make_cluster, make_env


def _one_core(pack: bool, envs: int = 8) -> Driver:
    d = Driver.of("elastic", make_cluster(cores=1, numa=1), cpu_packing=pack)
    for i in range(envs):
        d.add_ready_env(make_env(f"e{i}"))
    return d


def _teach(d: Driver, kind: str, runs: int, held_s: float, cpu_s: float) -> None:
    """``runs`` runs of ``kind`` one after another, each held ``held_s`` and using ``cpu_s``."""
    for i in range(runs):
        aid = f"{kind}-learn-{i}"
        d.step([ActionSubmitted(make_action(aid, kind=kind, env="e0", t_ori_s=None))])
        assert aid in d.state.running
        d.step([ActionFinished(aid, exec_s=held_s, cpu_s=cpu_s)], now=d.now + held_s)


@pytest.mark.parametrize(("pack", "started"), [(True, 5), (False, 1)])
def test_runs_of_a_kind_that_leaves_its_core_idle_share_a_cpu(pack: bool, started: int) -> None:
    d = _one_core(pack)
    _teach(d, "sf:run", packing.MIN_SAMPLES, held_s=0.1, cpu_s=0.02)  # 20% of a core
    d.step([ActionSubmitted(make_action(f"r{i}", kind="sf:run", env=f"e{i + 1}", t_ori_s=None)) for i in range(7)])
    running = sorted(a for a in d.state.running if a.startswith("r"))
    # packed: each is charged its measured 20% (x PACK_MARGIN) of the core, so five fit
    assert len(running) == started
    assert d.state.cpu[next(iter(d.state.cpu))].free_millicores >= 0
    validate(d.state)


def test_a_packed_start_keeps_its_whole_demand_as_its_limit() -> None:
    d = _one_core(True)
    _teach(d, "sf:run", packing.MIN_SAMPLES, held_s=0.1, cpu_s=0.02)
    r = d.step([ActionSubmitted(make_action("r0", kind="sf:run", env="e1", t_ori_s=None))])
    start = d.starts(r.decisions)["r0"]
    assert start.grant.cpu_millicores < 1000
    assert start.cpu_limit_millicores == 1000


def test_a_kind_is_not_packed_before_it_is_measured() -> None:
    d = _one_core(True)
    _teach(d, "sf:run", packing.MIN_SAMPLES - 1, held_s=0.1, cpu_s=0.02)
    d.step([ActionSubmitted(make_action(f"r{i}", kind="sf:run", env=f"e{i + 1}", t_ori_s=None)) for i in range(3)])
    assert len([a for a in d.state.running if a.startswith("r")]) == 1


def test_a_kind_that_uses_its_core_is_not_packed() -> None:
    d = _one_core(True)
    _teach(d, "build", packing.MIN_SAMPLES, held_s=0.5, cpu_s=0.49)
    r = d.step([ActionSubmitted(make_action(f"b{i}", kind="build", env=f"e{i + 1}", t_ori_s=None)) for i in range(3)])
    assert [a for a in d.state.running if a.startswith("b")] == ["b0"]
    assert d.starts(r.decisions)["b0"].cpu_limit_millicores is None  # a whole grant: no packing


def test_a_paused_or_preempted_run_teaches_nothing() -> None:
    d = _one_core(True)
    for i in range(packing.MIN_SAMPLES):
        aid = f"p{i}"
        d.step([ActionSubmitted(make_action(aid, kind="sf:run", env="e0", t_ori_s=None))])
        d.step([ActionFinished(aid, exec_s=1.0, cpu_s=0.01, paused_s=0.5)], now=d.now + 1.0)
    assert d.state.cpu_use.get("sf:run") is None


def test_elastic_actions_are_never_packed() -> None:
    d = _one_core(True)
    _teach(d, "sf:run", packing.MIN_SAMPLES, held_s=0.1, cpu_s=0.02)
    r = d.step([ActionSubmitted(make_action("el", kind="sf:run", env="e1", dop_min=1, dop_max=2))])
    start = d.starts(r.decisions)["el"]
    assert (start.grant.cpu_millicores, start.cpu_limit_millicores) == (1000, None)


def test_a_bad_cpu_packing_value_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError, match="cpu_packing"):
        Driver.of("elastic", make_cluster(cores=1, numa=1), cpu_packing="yes")
