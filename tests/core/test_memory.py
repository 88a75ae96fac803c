"""Memory per action (issue 21) in the core: footprints, grants, pause-and-grow, deadlock.

Each test drives ``Scheduler.step`` through the builders' checked ``Driver`` (invariants
after every round).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arl_tangram.core import memory
from arl_tangram.core.decisions import (
    Decision,
    GrowMemory,
    OomKill,
    PlaceEnv,
    RejectAction,
    StartAction,
)
from arl_tangram.core.events import (
    ActionFinished,
    ActionMemoryPaused,
    ActionSubmitted,
    EnvFootprint,
    EnvReady,
    EnvRequested,
    Event,
)
from arl_tangram.core.memory import FOOTPRINT_PRIOR_BYTES
from tests.core.builders import GIB, Driver, make_action, make_cluster, make_env, of_type

MIB = 1 << 20


def _driver(mem_bytes: int = 8 * GIB, cores: int = 8, **params: object) -> Driver:
    return Driver.of("elastic", make_cluster(cores=cores, mem_bytes=mem_bytes), **params)


def _mem_action(action_id: str, env: str, memory_bytes: int | None = None, kind: str = "tool"):  # type: ignore[no-untyped-def]
    return replace(make_action(action_id, env=env, kind=kind), memory_bytes=memory_bytes)


def test_density_envs_alive_at_once_beyond_their_limits() -> None:
    # 2 GiB limits on an 8 GiB node: a pod per env fits 4; footprints fit them all.
    for per_action, alive in ((True, 12), (False, 4)):
        d = _driver(memory_per_action=per_action)
        d.step([EnvRequested(make_env(f"e{i}", mem_bytes=2 * GIB)) for i in range(12)])
        assert len(of_type(d.log, PlaceEnv)) == alive, per_action


def test_declared_memory_is_the_grant_and_sets_the_env_limit() -> None:
    d = _driver()
    d.add_ready_env(make_env("e0", mem_bytes=2 * GIB))
    r = d.step([ActionSubmitted(_mem_action("a", "e0", 300 * MIB))])
    (start,) = of_type(r.decisions, StartAction)
    assert start.grant.mem_bytes == 300 * MIB
    assert start.mem_limit_bytes == FOOTPRINT_PRIOR_BYTES + 300 * MIB
    d.finish("a")
    assert d.state.cpu["cpu-0"].free_mem_bytes == 8 * GIB - FOOTPRINT_PRIOR_BYTES


def test_undeclared_memory_is_the_env_limit_then_the_learned_peak() -> None:
    d = _driver()
    d.add_ready_env(make_env("e0", mem_bytes=2 * GIB))
    for i in range(memory.PEAK_MIN_SAMPLES):
        r = d.step([ActionSubmitted(_mem_action(f"a{i}", "e0"))])
        (start,) = of_type(r.decisions, StartAction)
        assert start.grant.mem_bytes == 2 * GIB - FOOTPRINT_PRIOR_BYTES  # nothing learned yet
        d.step([ActionFinished(f"a{i}", peak_mem_bytes=100 * MIB)])
    r = d.step([ActionSubmitted(_mem_action("b", "e0"))])
    (start,) = of_type(r.decisions, StartAction)
    assert start.grant.mem_bytes == int(100 * MIB * memory.PEAK_MARGIN)




def test_memory_above_the_env_limit_is_rejected_naming_memory() -> None:
    d = _driver()
    d.add_ready_env(make_env("e0", mem_bytes=1 * GIB))
    r = d.step([ActionSubmitted(_mem_action("a", "e0", 3 * GIB))])
    (rej,) = of_type(r.decisions, RejectAction)
    assert rej.reason.startswith("memory:") and "limit" in rej.reason


def test_a_paused_action_grows_when_the_node_has_the_memory() -> None:
    d = _driver()
    d.add_ready_env(make_env("e0", mem_bytes=2 * GIB))
    d.step([ActionSubmitted(_mem_action("a", "e0", 100 * MIB))])
    r = d.step([ActionMemoryPaused("a", usage_bytes=FOOTPRINT_PRIOR_BYTES + 100 * MIB)], now=1.0)
    (grow,) = of_type(r.decisions, GrowMemory)
    assert grow.grant_bytes == 2 * 100 * MIB  # doubled (more than its usage + a step)
    assert grow.limit_bytes == FOOTPRINT_PRIOR_BYTES + grow.grant_bytes
    run = d.state.running["a"]
    assert run.paused_since_s is None and run.grant.mem_bytes == grow.grant_bytes and not d.state.mem_waits


def test_a_paused_action_waits_until_memory_is_freed_then_grows() -> None:
    d = _driver(mem_bytes=1 * GIB, mem_reserve_bytes=0)  # packs the node exactly: no headroom
    d.add_ready_env(make_env("e0", mem_bytes=1 * GIB))
    d.add_ready_env(make_env("e1", mem_bytes=1 * GIB))
    d.step([ActionSubmitted(_mem_action("a", "e0", 200 * MIB)), ActionSubmitted(_mem_action("b", "e1", 740 * MIB))])
    assert set(d.state.running) == {"a", "b"}
    r = d.step([ActionMemoryPaused("a", usage_bytes=FOOTPRINT_PRIOR_BYTES + 200 * MIB)], now=1.0)
    assert not of_type(r.decisions, GrowMemory) and not of_type(r.decisions, OomKill)
    assert d.state.running["a"].paused_since_s == 1.0 and "a" in d.state.mem_waits
    # a new action may not take what the paused one waits for
    assert d.state.cpu["cpu-0"].free_mem_bytes == 52 * MIB  # a 40 MiB action would fit, but a waits for 200
    r = d.step([ActionSubmitted(_mem_action("c", "e1", 40 * MIB))], now=1.5)
    assert not of_type(r.decisions, StartAction)
    r = d.step([ActionFinished("b")], now=3.0)
    (grow,) = of_type(r.decisions, GrowMemory)
    assert grow.action_id == "a" and d.state.running["a"].paused_s == 2.0


def test_past_the_env_limit_it_ends_oom_killed_and_the_env_runs_again() -> None:
    d = _driver()
    d.add_ready_env(make_env("e0", mem_bytes=256 * MIB))
    d.step([ActionSubmitted(_mem_action("a", "e0"))])  # nothing learned: the whole limit
    r = d.step([ActionMemoryPaused("a", usage_bytes=256 * MIB)], now=1.0)
    (kill,) = of_type(r.decisions, OomKill)
    assert kill.action_id == "a" and "limit" in kill.reason
    d.step([ActionFinished("a", "oom_killed")], now=1.1)
    r = d.step([ActionSubmitted(_mem_action("b", "e0", 64 * MIB))], now=1.2)
    assert [s.action_id for s in of_type(r.decisions, StartAction)] == ["b"]


def test_a_memory_deadlock_ends_the_youngest_paused_action() -> None:
    d = _driver(mem_bytes=1 * GIB, mem_reserve_bytes=0)  # packs the node exactly: no headroom
    for i in range(3):
        d.add_ready_env(make_env(f"e{i}", mem_bytes=1 * GIB))
    d.step([ActionSubmitted(_mem_action(f"a{i}", f"e{i}", 310 * MIB)) for i in range(3)])
    assert len(d.state.running) == 3
    r = d.step([ActionMemoryPaused(f"a{i}", FOOTPRINT_PRIOR_BYTES + 310 * MIB) for i in range(3)], now=1.0)
    (kill,) = of_type(r.decisions, OomKill)
    assert kill.action_id == "a2" and kill.reason.startswith("memory_deadlock")
    r = d.step([ActionFinished("a2", "oom_killed")], now=1.5)
    assert [g.action_id for g in of_type(r.decisions, GrowMemory)] == ["a0"]  # oldest first; a1 still waits


def test_a_growing_footprint_is_charged_and_what_does_not_fit_is_reported() -> None:
    d = _driver(mem_bytes=1 * GIB)
    d.add_ready_env(make_env("e0", mem_bytes=1 * GIB))
    d.step([EnvFootprint("e0", 300 * MIB)])
    assert d.state.envs["e0"].held.mem_bytes == 300 * MIB
    assert d.state.cpu["cpu-0"].free_mem_bytes == 1 * GIB - 300 * MIB
    d.step([EnvFootprint("e0", 100 * MIB)])  # falls by halves
    assert d.state.envs["e0"].held.mem_bytes == 200 * MIB


def test_k8s_static_keeps_reserving_the_limit() -> None:
    d = Driver.of("k8s-static", make_cluster(cores=64, mem_bytes=8 * GIB), pod_millicores=1000)
    d.step([EnvRequested(make_env(f"e{i}", mem_bytes=2 * GIB)) for i in range(6)])
    assert [p.held.mem_bytes for p in of_type(d.log, PlaceEnv)] == [2 * GIB] * 4


# --- properties ---------------------------------------------------------------------------

NODE_MEM = 1 * GIB
RESERVE = 64 * MIB
LIMITS = (256 * MIB, 512 * MIB, 1 * GIB)
DEMANDS = (None, 32 * MIB, 200 * MIB)

op_st = st.one_of(
        st.tuples(st.just("env"), st.sampled_from(LIMITS)),
        st.tuples(st.just("act"), st.integers(0, 7), st.sampled_from(DEMANDS)),
        st.tuples(st.just("pause"), st.integers(0, 7), st.integers(0, 600)),
        st.tuples(st.just("finish"), st.integers(0, 7), st.integers(0, 300)),
        st.tuples(st.just("footprint"), st.integers(0, 7), st.integers(0, 200)),
)
ops_st = st.lists(op_st, max_size=40)


def _pick(items: list[str], k: int) -> str | None:
    return sorted(items)[k % len(items)] if items else None


def _event(d: Driver, op: tuple[Any, ...], n: int) -> Event | None:
    envs = [e for e, env in d.state.envs.items() if env.ready]
    running = [a for a, r in d.state.running.items() if r.pause_cause != "oom"]
    if op[0] == "env":
        return EnvRequested(make_env(f"e{n}", mem_bytes=op[1]))
    if op[0] == "act" and (env_id := _pick(envs, op[1])) is not None:
        want = op[2] if op[2] is None else min(op[2], d.state.envs[env_id].spec.mem_bytes)
        return ActionSubmitted(_mem_action(f"a{n}", env_id, want, kind=f"k{n % 2}"))
    if op[0] == "pause" and (aid := _pick(running, op[1])) is not None:
        return ActionMemoryPaused(aid, op[2] * MIB)
    if op[0] == "finish" and (aid := _pick([a for a in running if a not in d.state.mem_waits], op[1])) is not None:
        return ActionFinished(aid, peak_mem_bytes=op[2] * MIB)
    if op[0] == "footprint" and (env_id := _pick(envs, op[1])) is not None:
        return EnvFootprint(env_id, op[2] * MIB)
    return None


def _admitted_within_reserve(d: Driver, decisions: tuple[Decision, ...]) -> None:
    grew = any(
        isinstance(x, GrowMemory) or (isinstance(x, StartAction) and x.grant.mem_bytes) or (isinstance(x, PlaceEnv) and x.held.mem_bytes)
        for x in decisions
    )  # fmt: skip
    if grew:
        assert NODE_MEM - d.state.cpu["cpu-0"].free_mem_bytes <= NODE_MEM - RESERVE, "admitted past the reserve"


def _answer(d: Driver, decisions: tuple[Decision, ...], now: float) -> list[Event]:
    """What the node does: envs start, ordered OOM kills end their action."""
    out: list[Event] = [EnvReady(x.env_id) for x in decisions if isinstance(x, PlaceEnv)]
    out += [ActionFinished(x.action_id, "oom_killed") for x in decisions if isinstance(x, OomKill)]
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_st)
def test_memory_ledger_within_reserve_and_every_pause_ends(ops: list[tuple[Any, ...]]) -> None:
    d = _driver(mem_bytes=NODE_MEM, cores=64, mem_reserve_bytes=RESERVE)
    now, pending = 0.0, []
    for n, op in enumerate(ops):
        now += 0.1
        event = _event(d, op, n)
        r = d.step([*pending, *([event] if event else [])], now=now)
        _admitted_within_reserve(d, r.decisions)
        pending = _answer(d, r.decisions, now)
    # Drain: the node finishes whatever is not paused; every paused action must end (grow
    # and finish, or be OOM-killed) and every queued one must start: nothing starves.
    for _ in range(200):
        if not d.state.running and not d.state.queue_cpu and not pending:
            break
        now += 0.1
        done = [ActionFinished(a) for a, r in sorted(d.state.running.items()) if a not in d.state.mem_waits and r.pause_cause != "oom"]
        r = d.step([*pending, *done], now=now)
        _admitted_within_reserve(d, r.decisions)
        pending = _answer(d, r.decisions, now)
    assert not d.state.mem_waits and not d.state.running and not d.state.queue_cpu


def test_concurrent_runs_with_no_known_demand_share_their_env_limit() -> None:
    # Nothing declared or learned: the first run is granted the env's limit, a concurrent
    # one on the same env shares it (granted what is left) instead of waiting for it.
    d = _driver()
    d.add_ready_env(make_env("e0", mem_bytes=512 * MIB))
    r = d.step([ActionSubmitted(_mem_action("a", "e0")), ActionSubmitted(_mem_action("b", "e0"))])
    starts = {s.action_id: s for s in of_type(r.decisions, StartAction)}
    assert set(starts) == {"a", "b"}
    assert starts["a"].grant.mem_bytes + starts["b"].grant.mem_bytes == 512 * MIB - FOOTPRINT_PRIOR_BYTES


def test_paused_siblings_never_grow_past_their_env_limit_together() -> None:
    # found by the ledger property: two paused actions of one env, each capped alone by what
    # the other holds, both grew in one round (footprint + grants over the env's limit)
    d = _driver(mem_bytes=4 * GIB, mem_reserve_bytes=0)
    d.add_ready_env(make_env("e0", mem_bytes=512 * MIB))
    d.step([ActionSubmitted(_mem_action(a, "e0", 200 * MIB)) for a in ("a", "b")])
    r = d.step([ActionMemoryPaused(a, 500 * MIB) for a in ("a", "b")], now=1.0)  # the Driver validates the ledger
    assert [g.action_id for g in of_type(r.decisions, GrowMemory)] == ["a"]  # the older one grows
    assert [k.action_id for k in of_type(r.decisions, OomKill)] == ["b"]
