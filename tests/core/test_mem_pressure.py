"""Memory pressure on the node (issue 21) in the core: the node's reports close and reopen
admission; the ledger never admits past what the node measured free less the reserve.

Driven through the builders' checked ``Driver`` (invariants after every round).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arl_tangram.core.decisions import Decision, GrowMemory, PlaceEnv, StartAction
from arl_tangram.core.events import (
    ActionFinished,
    ActionMemoryPaused,
    ActionSubmitted,
    EnvRequested,
    NodeMemoryPressure,
)
from tests.core.builders import GIB, make_env, of_type
from tests.core.test_memory import (
    MIB,
    NODE_MEM,
    RESERVE,
    _answer,
    _driver,
    _event,
    _mem_action,
    op_st,
)


def test_pressure_stops_envs_and_grants_until_the_node_recovers() -> None:
    d = _driver(mem_bytes=4 * GIB, mem_reserve_bytes=256 * MIB)
    d.add_ready_env(make_env("e0", mem_bytes=2 * GIB))
    # something outside the accounting took memory: 100 MiB really free, under the reserve
    r = d.step([NodeMemoryPressure("cpu-0", 100 * MIB, 0.0)])
    r = d.step([EnvRequested(make_env("e1")), ActionSubmitted(_mem_action("a", "e0", 64 * MIB))])
    assert not of_type(r.decisions, PlaceEnv) and not of_type(r.decisions, StartAction)
    r = d.step([NodeMemoryPressure("cpu-0", 3 * GIB, 0.0)])
    assert len(of_type(r.decisions, PlaceEnv)) == 1 and list(d.starts(r.decisions)) == ["a"]


def test_a_psi_stall_closes_admission_and_keeps_paused_actions_waiting() -> None:
    d = _driver(mem_bytes=4 * GIB)
    d.add_ready_env(make_env("e0", mem_bytes=2 * GIB))
    d.step([ActionSubmitted(_mem_action("a", "e0", 64 * MIB))])
    d.step([NodeMemoryPressure("cpu-0", 3 * GIB, 40.0)])  # plenty free, but the kernel stalls
    r = d.step([ActionMemoryPaused("a", 100 * MIB), ActionSubmitted(_mem_action("b", "e0", 64 * MIB))])
    assert not of_type(r.decisions, GrowMemory) and "b" not in d.starts()
    r = d.step([NodeMemoryPressure("cpu-0", 3 * GIB, 0.5)])
    assert [g.action_id for g in of_type(r.decisions, GrowMemory)] == ["a"] and "b" in d.starts(r.decisions)


pressure_ops = st.lists(
    st.one_of(op_st, st.tuples(st.just("report"), st.integers(0, 1024), st.sampled_from((0.0, 2.0, 50.0)))), max_size=40
)


def _admits(decisions: tuple[Decision, ...]) -> bool:
    return any(
        isinstance(x, GrowMemory) or (isinstance(x, StartAction) and x.grant.mem_bytes) or (isinstance(x, PlaceEnv) and x.held.mem_bytes)
        for x in decisions
    )  # fmt: skip


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=pressure_ops)
def test_never_admits_past_the_measured_free_memory_less_the_reserve(ops: list[tuple[Any, ...]]) -> None:
    d = _driver(mem_bytes=NODE_MEM, cores=64, mem_reserve_bytes=RESERVE)
    now, pending = 0.0, []
    # The test's own model: at the last report the ledger believed ``believed`` bytes free
    # and the node really had ``really`` (0 while the kernel stalls). Taking, net of what
    # finished since, more than ``really - RESERVE`` is what the kernel would OOM-kill.
    believed = really = NODE_MEM
    for n, op in enumerate(ops):
        now += 0.1
        if op[0] == "report":
            pending = _answer(d, d.step(pending, now=now).decisions, now)  # the node's own events first
            believed, really = d.state.cpu["cpu-0"].free_mem_bytes, (0 if op[2] >= 10.0 else op[1] * MIB)
            event: Any = NodeMemoryPressure("cpu-0", op[1] * MIB, op[2])
        else:
            event = _event(d, op, n)
        r = d.step([*pending, *([event] if event else [])], now=now)
        free = d.state.cpu["cpu-0"].free_mem_bytes
        if _admits(r.decisions):
            assert NODE_MEM - free <= NODE_MEM - RESERVE, "admitted past the node's memory less the reserve"
            assert believed - free <= really - RESERVE, "admitted past what the node measured free"
        pending = _answer(d, r.decisions, now)
    # Recovery: the node reports its memory free again; every paused action ends and every
    # queued one starts: nothing starves under pressure.
    pending.append(NodeMemoryPressure("cpu-0", NODE_MEM, 0.0))
    for _ in range(200):
        if not d.state.running and not d.state.queue_cpu and not pending:
            break
        now += 0.1
        done = [ActionFinished(a) for a, r in sorted(d.state.running.items()) if a not in d.state.mem_waits and r.pause_cause != "oom"]
        r = d.step([*pending, *done], now=now)
        pending = _answer(d, r.decisions, now)
    assert not d.state.mem_waits and not d.state.running and not d.state.queue_cpu
