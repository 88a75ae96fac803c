"""Property tests: random event sequences through ``Scheduler.step`` for every policy.

- After every step ``invariants.validate`` passes and every decision agrees with the state
  (no over-allocation of a node, GPU chunk or quota; DoP within bounds; nothing running is
  touched except by its own finish).
- Same events, same decisions (determinism), also across processes with different hash seeds.
- Under a bounded load where every action finishes, every submitted action starts.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.decisions import (
    CancelAction,
    Decision,
    EvictService,
    LoadService,
    PlaceEnv,
    RejectAction,
    ReleaseEnv,
    StartAction,
)
from arl_tangram.core.events import (
    ActionCancelled,
    ActionFinished,
    ActionSubmitted,
    EnvFailed,
    EnvReady,
    EnvReleased,
    EnvRequested,
    Event,
    NodeJoined,
    NodeLost,
    ReplicaFailed,
    ServiceReady,
)
from arl_tangram.core.invariants import validate
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec, CpuNodeSpec, GpuNodeSpec, QuotaPoolSpec
from arl_tangram.runtime.loop import ControllerLoop, Executor, ManualClock, Round
from tests.core.builders import GIB, make_action, make_cluster, make_env, make_service

POLICIES = ["elastic", "k8s-static", "task-pool", "fixed-dop", "ideal"]
SERVICES = {"s1": make_service("s1", devices_min=1, devices_max=4), "s2": make_service("s2", devices_min=1, devices_max=2)}
DEPLOYMENTS = {"s1": (1, 4), "s2": (1, 2)}
PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cluster(cores: int = 8) -> ClusterSpec:
    return make_cluster(
        cpu_nodes=2, cores=cores, numa=2, mem_bytes=6 * GIB, gpu_nodes=1,
        quota_pools=[QuotaPoolSpec("api", 3, 2.0)], services=SERVICES,
    )


def policy_params(name: str) -> dict[str, Any]:
    if name == "k8s-static":
        return {"pod_millicores": 2000, "deployments": DEPLOYMENTS}
    if name == "task-pool":
        return {"deployments": DEPLOYMENTS, "partitions": {"A": ("cpu-0",), "B": ("cpu-1",)}, "dop": 2}
    if name == "fixed-dop":
        return {"dop": 4, "aging_s": 3.0}
    if name == "elastic":
        return {"depth": 8, "aging_s": 3.0}
    return {}


# --- checks on one step ---------------------------------------------------------------


def check_step(before: ClusterState, events: tuple[Event, ...], decisions: tuple[Decision, ...], after: ClusterState) -> None:
    validate(after)
    finished = {e.action_id for e in events if isinstance(e, ActionFinished)}
    lost_nodes = {e.node_id for e in events if isinstance(e, NodeLost)}
    # nothing running is resized, moved or dropped except by its own finish, or ended with an
    # explicit outcome when its node, env or replica is gone
    ended = {d.action_id: d for d in decisions if isinstance(d, RejectAction) and d.action_id in before.running}
    for aid, run in before.running.items():
        if aid in finished:
            continue
        if aid in ended:
            assert aid not in after.running
            assert (ended[aid].outcome, ended[aid].reason.split(":")[0]) in (
                ("error", "node_lost"), ("error", "env_failed"), ("error", "replica_failed"),
                ("cancelled", "released by its client"),
            ), ended[aid]
            continue
        assert run.node_id not in lost_nodes, f"{aid} on a lost node got no outcome"
        assert after.running.get(aid) == run, f"running action {aid} was changed"
    loaded = {d.replica_id for d in decisions if isinstance(d, LoadService)}
    for d in decisions:
        if isinstance(d, StartAction):
            run = after.running[d.action_id]
            spec = run.spec
            assert run.dop == d.dop and run.node_id == d.node_id and run.grant == d.grant
            assert spec.dop_min <= d.dop <= spec.dop_max
            if spec.binding.kind == "service":
                rep = after.replicas[d.replica_id or ""]
                assert rep.service == spec.binding.name and rep.busy_action == d.action_id
                assert d.dop <= rep.size, f"{d.action_id} at dop {d.dop} on a {rep.size}-device replica"
            if spec.binding.kind == "env":
                env = after.envs[spec.binding.name]
                assert env.ready and env.node_id == d.node_id
        elif isinstance(d, RejectAction):
            assert d.action_id not in after.queued() and d.action_id not in after.running
        elif isinstance(d, EvictService):
            rep = before.replicas.get(d.replica_id)
            assert rep is not None or d.replica_id in loaded
            if rep is not None:
                assert not rep.pinned, f"evicted a pinned replica {rep}"
                assert rep.busy_action is None or rep.busy_action in finished, f"evicted a busy replica {rep}"
            assert d.replica_id not in after.replicas
        elif isinstance(d, PlaceEnv):
            assert after.envs[d.env_id].node_id == d.node_id
        elif isinstance(d, CancelAction):
            assert d.action_id in before.running and after.running.get(d.action_id) == before.running[d.action_id]
        elif isinstance(d, ReleaseEnv):
            assert d.env_id not in after.envs
    # a running service action keeps its replica
    for aid, run in after.running.items():
        if run.replica_id is not None:
            rep = after.replicas.get(run.replica_id)
            assert rep is not None and rep.busy_action == aid, f"{aid} runs on replica {run.replica_id}, now {rep}"


# --- random event sequences -------------------------------------------------------------

dop_pair = st.tuples(st.sampled_from([1, 1, 1, 2, 4, 8, 9]), st.sampled_from([0, 0, 1, 3, 7, 15])).map(lambda t: (t[0], t[0] + t[1]))
gpu_pair = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8])).map(lambda t: (min(t), max(t)))

env_op = st.tuples(st.just("env"), st.sampled_from(["A", "B"]), st.integers(1, 3))
ready_op = st.tuples(st.just("ready"), st.integers(0, 20))
cpu_op = st.tuples(st.just("cpu"), st.integers(0, 20), dop_pair, st.sampled_from([0.0, 0.05, 0.5, 1.0]), st.sampled_from([None, 0.5, 3.0]))
cmd_op = st.tuples(st.just("cmd"), st.integers(0, 20), st.sampled_from([0.2, 1.0]))
gpu_op = st.tuples(st.just("gpu"), st.sampled_from(["s1", "s2"]), gpu_pair, st.sampled_from([None, 0.3, 2.0]))
finish_op = st.tuples(st.just("finish"), st.integers(0, 20))
op_st = st.one_of(
    env_op, env_op, ready_op, ready_op,
    st.tuples(st.just("release"), st.integers(0, 20)),
    cpu_op, cpu_op, cpu_op, cmd_op, cmd_op,
    st.tuples(st.just("unbound"), dop_pair),
    gpu_op, gpu_op, gpu_op,
    st.tuples(st.just("api"), st.sampled_from([0.1, 1.0])),
    finish_op, finish_op, finish_op,
    st.tuples(st.just("finish_all"),),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("svc_ready"),),
    st.tuples(st.just("advance"), st.sampled_from([0.1, 1.0, 5.0])),
    st.tuples(st.just("big"),),
    st.tuples(st.just("lose"), st.sampled_from(["cpu-1", "gpu-0"])),
    st.tuples(st.just("env_fail"), st.integers(0, 20)),
    st.tuples(st.just("replica_fail"), st.integers(0, 20)),
    st.tuples(st.just("cancel_running"), st.integers(0, 20)),
    st.tuples(st.just("join"), st.sampled_from(["cpu-1", "cpu-9", "gpu-0", "gpu-9"])),
)


def _pick(items: list[str], k: int) -> str | None:
    return items[k % len(items)] if items else None


def events_for(op: tuple[Any, ...], state: ClusterState, ids: itertools.count[int]) -> tuple[list[Event], float]:
    """Turn an abstract op into concrete events against the current state, and a time step."""
    kind = op[0]
    n = next(ids)
    envs = sorted(state.envs)
    if kind == "env":
        return [EnvRequested(make_env(f"e{n}", op[2] * GIB, tenant=op[1]))], 0.0
    if kind == "ready":
        placed = [e for e in envs if state.envs[e].node_id is not None and not state.envs[e].ready]
        env = _pick(placed, op[1])
        return ([EnvReady(env)] if env else []), 0.0
    if kind == "release":
        env = _pick(envs, op[1])
        return ([EnvReleased(env)] if env else []), 0.0
    if kind in ("cpu", "cmd"):
        pre: list[Event] = []
        env = _pick(envs, op[1])
        if op[1] == 20:
            env = "nowhere"  # an env that does not exist: rejected
        elif env is None:  # no env yet: request one in the same round
            env = f"e{n}"
            pre.append(EnvRequested(make_env(env, GIB, tenant="A")))
        if kind == "cmd":
            return [*pre, ActionSubmitted(make_action(f"m{n}", kind="cmd", env=env, t_ori_s=op[2]))], 0.0
        lo, hi = op[2]
        spec = make_action(f"c{n}", env=env, dop_min=lo, dop_max=hi, serial_fraction=op[3], t_ori_s=op[4])
        return [*pre, ActionSubmitted(spec)], 0.0
    if kind == "unbound":
        lo, hi = op[1]
        return [ActionSubmitted(make_action(f"u{n}", dop_min=lo, dop_max=hi, serial_fraction=0.1))], 0.0
    if kind == "gpu":
        lo, hi = op[2]
        return [ActionSubmitted(make_action(f"g{n}", kind=op[1], service=op[1], dop_min=lo, dop_max=hi, t_ori_s=op[3]))], 0.0
    if kind == "api":
        return [ActionSubmitted(make_action(f"q{n}", kind="search", api="api", t_ori_s=op[1]))], 0.0
    if kind == "finish":
        aid = _pick(sorted(state.running), op[1])
        return ([ActionFinished(aid, exec_s=0.5)] if aid else []), 0.5
    if kind == "finish_all":
        return [ActionFinished(a) for a in sorted(state.running)], 1.0
    if kind == "cancel":
        aid = _pick(list(state.queued()), op[1])
        return ([ActionCancelled(aid)] if aid else []), 0.0
    if kind == "svc_ready":
        return [ServiceReady(r) for r in sorted(state.replicas) if not state.replicas[r].ready], 0.0
    if kind == "advance":
        return [], float(op[1])
    if kind == "big":
        return [ActionSubmitted(make_action(f"b{n}", env=_pick(envs, 0) or "x", dop_min=64, dop_max=64))], 0.0
    if kind == "lose":
        return [NodeLost(op[1])], 0.0
    if kind == "env_fail":
        env = _pick(envs, op[1])
        return ([EnvFailed(env, "sandbox died")] if env else []), 0.0
    if kind == "replica_fail":
        rid = _pick(sorted(r for r, rep in state.replicas.items() if not rep.pinned), op[1])
        return ([ReplicaFailed(rid, "load failed")] if rid else []), 0.0
    if kind == "cancel_running":
        aid = _pick(sorted(state.running), op[1])
        return ([ActionCancelled(aid)] if aid else []), 0.0
    if kind == "join":
        node = CpuNodeSpec(op[1], (4, 4), 64 * GIB) if op[1].startswith("cpu") else GpuNodeSpec(op[1], 8)
        return [NodeJoined(node)], 0.0
    raise AssertionError(kind)


def run_ops(policy: str, ops: list[tuple[Any, ...]], check: bool = True) -> list[tuple[tuple[Decision, ...], float | None]]:
    scheduler = Scheduler(make_policy(policy, **policy_params(policy)))
    boot = scheduler.bootstrap(ClusterState.initial(cluster()))
    state = boot.state
    trace: list[tuple[tuple[Decision, ...], float | None]] = [(boot.decisions, None)]
    ids = itertools.count()
    now = 0.0
    for op in ops:
        events, dt = events_for(op, state, ids)
        now += dt
        result = scheduler.step(state, tuple(events), now)
        if check:
            check_step(state, tuple(events), result.decisions, result.state)
        if result.wake_at is not None:
            assert result.wake_at > now - 1e-9, "a wake-up in the past"
        state = result.state
        trace.append((result.decisions, result.wake_at))
    return trace


ops_st = st.lists(op_st, min_size=1, max_size=60)


@PROPS
@given(ops=ops_st)
def test_elastic_never_over_allocates(ops: list[tuple[Any, ...]]) -> None:
    run_ops("elastic", ops)


@PROPS
@given(ops=ops_st)
@example(ops=[("svc_ready",), ("gpu", "s2", (4, 4), None)])  # wider than s2's 2-device replica
def test_k8s_static_never_over_allocates(ops: list[tuple[Any, ...]]) -> None:
    run_ops("k8s-static", ops)


@PROPS
@given(ops=ops_st)
@example(ops=[("svc_ready",), ("gpu", "s2", (4, 4), None)])  # wider than s2's 2-device replica
def test_task_pool_never_over_allocates(ops: list[tuple[Any, ...]]) -> None:
    run_ops("task-pool", ops)


@PROPS
@given(ops=ops_st)
def test_fixed_dop_never_over_allocates(ops: list[tuple[Any, ...]]) -> None:
    run_ops("fixed-dop", ops)


@PROPS
@given(ops=ops_st)
def test_ideal_never_over_allocates(ops: list[tuple[Any, ...]]) -> None:
    run_ops("ideal", ops)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), ops=ops_st)
def test_same_events_same_decisions(policy: str, ops: list[tuple[Any, ...]]) -> None:
    assert run_ops(policy, ops, check=False) == run_ops(policy, ops, check=False)


_DETERMINISM_SCRIPT = """
import json, random, sys
from tests.core.test_properties import run_ops, op_st
rng = random.Random(7)
kinds = ["env", "ready", "cpu", "cmd", "gpu", "api", "finish", "svc_ready", "advance", "release"]
ops = []
for i in range(150):
    k = rng.choice(kinds)
    if k == "env": ops.append(("env", rng.choice("AB"), rng.randint(1, 2)))
    elif k in ("ready", "finish", "release"): ops.append((k, rng.randint(0, 20)))
    elif k == "cpu": ops.append(("cpu", rng.randint(0, 20), (1, rng.randint(1, 12)), 0.05, rng.choice([None, 1.0])))
    elif k == "cmd": ops.append(("cmd", rng.randint(0, 20), 0.5))
    elif k == "gpu": ops.append(("gpu", rng.choice(["s1", "s2"]), (1, rng.choice([1, 2, 4])), 0.5))
    elif k == "api": ops.append(("api", 0.5))
    elif k == "advance": ops.append(("advance", 1.0))
    else: ops.append((k,))
out = {p: repr(run_ops(p, ops, check=False)) for p in sys.argv[1:]}
print(json.dumps(out))
"""


def test_decisions_do_not_depend_on_the_hash_seed() -> None:
    root = Path(__file__).resolve().parents[2]
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        proc = subprocess.run(
            [sys.executable, "-c", _DETERMINISM_SCRIPT, *POLICIES], cwd=root, env=env,
            capture_output=True, text=True, timeout=120, check=True,
        )
        outputs.append(json.loads(proc.stdout))
    for policy in POLICIES:
        assert outputs[0][policy] == outputs[1][policy], policy
        assert "StartAction" in outputs[0][policy]


# --- no starvation under a bounded load ----------------------------------------------------


@dataclass
class Load:
    """Trajectories (env + a chain of env actions), plus independent GPU and API actions."""

    trajectories: list[tuple[str, int, list[tuple[int, int, float, float]]]]  # tenant, mem GiB, [(dop_min, dop_max, serial, t_ori)]
    gpu: list[tuple[float, str, tuple[int, int], float]]  # submit time, service, dop range, t_ori
    api: list[tuple[float, float]]  # submit time, t_ori


cpu_action_st = st.tuples(
    st.sampled_from([1, 1, 2, 8]), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([0.0, 0.05, 0.3, 1.0]), st.sampled_from([0.2, 1.0, 4.0])
).map(lambda t: (min(t[0], t[1]), t[1], t[2], t[3]))
load_st = st.builds(
    Load,
    st.lists(st.tuples(st.sampled_from(["A", "B"]), st.integers(1, 3), st.lists(cpu_action_st, min_size=1, max_size=4)), max_size=8),
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 2.0]), st.sampled_from(["s1", "s2"]), st.sampled_from([(1, 1), (1, 2), (2, 2), (1, 4)]), st.sampled_from([0.2, 1.0])),
        max_size=6,
    ),
    st.lists(st.tuples(st.sampled_from([0.0, 0.1, 1.0]), st.sampled_from([0.1, 0.5])), max_size=8),
)


@dataclass
class Harness(Executor):
    """Instant managers on a virtual clock, as the executor of the shared controller loop:
    envs are ready and replicas loaded when placed, running actions finish at their expected
    end, a trajectory's next action follows its previous one, and the loop runs a round on
    every event and every ``wake_at``. Every round is checked against the state before it."""

    policy: str
    load: Load
    cores: int = 8
    loop: ControllerLoop = field(init=False)
    clock: ManualClock = field(default_factory=ManualClock)
    timers: list[tuple[float, int, Event | str]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)
    submitted: set[str] = field(default_factory=set)
    started: set[str] = field(default_factory=set)
    submitted_at_s: dict[str, float] = field(default_factory=dict)
    started_at_s: dict[str, float] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    chains: dict[str, list[ActionSpec]] = field(default_factory=dict)
    before: ClusterState | None = None

    def __post_init__(self) -> None:
        scheduler = Scheduler(make_policy(self.policy, **policy_params(self.policy)))
        initial = ClusterState.initial(cluster(self.cores))
        self.before = initial
        self.loop = ControllerLoop(scheduler, initial, self.clock, log=self._check_round, on_wake=lambda t: self._at(t, "wake"))
        self.loop.attach(self)
        self.loop.bootstrap()
        for i, (tenant, mem, actions) in enumerate(self.load.trajectories):
            env = f"e{i}"
            self.chains[env] = [
                make_action(f"t{i}/{k}", env=env, dop_min=dmin, dop_max=dmax, serial_fraction=s, t_ori_s=t, tenant=tenant)
                for k, (dmin, dmax, s, t) in enumerate(actions)
            ]
            self._at(0.1 * i, EnvRequested(make_env(env, mem * GIB, tenant=tenant)))
        for j, (at, svc, (lo, hi), t) in enumerate(self.load.gpu):
            self._submit_at(at, make_action(f"g{j}", kind=svc, service=svc, dop_min=lo, dop_max=hi, t_ori_s=t))
        for j, (at, t) in enumerate(self.load.api):
            self._submit_at(at, make_action(f"q{j}", kind="search", api="api", t_ori_s=t))

    @property
    def state(self) -> ClusterState:
        return self.loop.state

    def _at(self, t: float, what: Event | str) -> None:
        heapq.heappush(self.timers, (t, next(self.seq), what))

    def _submit_at(self, t: float, spec: ActionSpec) -> None:
        self.submitted.add(spec.action_id)
        self.submitted_at_s[spec.action_id] = t
        self._at(t, ActionSubmitted(spec))

    # -- the executor ---------------------------------------------------------------------
    def place_env(self, d: PlaceEnv) -> None:
        now = self.clock.now_s
        self._at(now + 0.05, EnvReady(d.env_id, stimulus_id=d.stimulus_id))
        chain = self.chains.get(d.env_id)
        if chain:
            self._submit_at(now + 0.05, chain.pop(0))

    def load_service(self, d: LoadService) -> None:
        self._at(self.clock.now_s + 0.2, ServiceReady(d.replica_id, stimulus_id=d.stimulus_id))

    def start_action(self, d: StartAction) -> None:
        self.started.add(d.action_id)
        self.started_at_s[d.action_id] = self.clock.now_s
        run = self.state.running[d.action_id]
        self._at(max(run.expected_end_s, self.clock.now_s), ActionFinished(d.action_id, stimulus_id=d.stimulus_id))

    def reject_action(self, d: RejectAction) -> None:
        self.rejected.add(d.action_id)

    def cancel_action(self, d: CancelAction) -> None:
        raise AssertionError("the harness never cancels")

    def release_env(self, d: ReleaseEnv) -> None:
        pass

    def evict_service(self, d: EvictService) -> None:
        pass

    # -- checks and driving ---------------------------------------------------------------
    def _check_round(self, r: Round) -> None:
        assert self.before is not None
        check_step(self.before, r.events, r.decisions, self.loop.state)
        self.before = self.loop.state
        if r.wake_at is not None:
            stuck = not r.events and not r.decisions and r.wake_at <= r.now_s
            assert not stuck, f"livelock: a wake-up round at {r.now_s} did nothing and asked to wake at {r.wake_at}"
        for e in r.events:
            if isinstance(e, ActionFinished):
                self._after_finish(e.action_id, r.now_s)

    def _after_finish(self, action_id: str, now: float) -> None:
        env = action_id.split("/")[0].replace("t", "e", 1) if action_id.startswith("t") else None
        if env is None:
            return
        chain = self.chains.get(env)
        if chain:
            self._submit_at(now + 0.1, chain.pop(0))
        else:
            self._at(now + 0.1, EnvReleased(env))

    def run(self, max_rounds: int = 2000) -> None:
        for _ in range(max_rounds):
            if not self.timers:
                return
            self.clock.now_s = max(self.clock.now_s, self.timers[0][0])
            while self.timers and self.timers[0][0] <= self.clock.now_s:
                what = heapq.heappop(self.timers)[2]
                if not isinstance(what, str):
                    self.loop.post(what)
            if self.loop.due():
                self.loop.run_round()
        raise AssertionError(f"no quiescence after {max_rounds} rounds: queued {sorted(self.state.queued())}")


def _assert_everything_started(h: Harness) -> None:
    h.run()
    assert not h.rejected, f"rejected: {sorted(h.rejected)}"
    never = sorted(h.submitted - h.started)
    assert not never, f"{h.policy}: never started {never}; queued {sorted(h.state.queued())}"
    assert not h.state.running and not h.state.queued() and not h.state.envs


STARVE = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@STARVE
@given(load=load_st)
@example(load=Load(  # the token bucket refills in float steps between wake-ups
    [("A", 1, [(1, 1, 0.0, 1.0)]), ("A", 1, [(1, 1, 0.0, 0.2)])], [], [(0.0, 0.1), (0.0, 0.1), (0.1, 0.1), (0.1, 0.1)]
))
def test_elastic_starts_every_action(load: Load) -> None:
    _assert_everything_started(Harness("elastic", load))


@STARVE
@given(load=load_st)
@example(load=Load([("A", 1, [(1, 1, 0.0, 0.2), (1, 1, 0.0, 0.2)])] + [("A", 1, [(1, 1, 0.0, 0.2)])] * 4, [], []))  # pods come and go
def test_k8s_static_starts_every_action(load: Load) -> None:
    _assert_everything_started(Harness("k8s-static", load))


@STARVE
@given(load=load_st)
def test_task_pool_starts_every_action(load: Load) -> None:
    _assert_everything_started(Harness("task-pool", load))


@STARVE
@given(load=load_st)
def test_fixed_dop_starts_every_action(load: Load) -> None:
    _assert_everything_started(Harness("fixed-dop", load))


@STARVE
@given(load=load_st)
def test_ideal_starts_every_action(load: Load) -> None:
    # ideal is the unlimited-resources bound: run it where every dop_max fits a node
    _assert_everything_started(Harness("ideal", load, cores=32))


def test_aging_reserves_the_node_for_a_wide_action() -> None:
    """A stream of narrow actions cannot keep a wide one waiting forever: once it ages past
    the bound, the node is reserved for it."""
    narrow = [(1, 1, 0.0, 1.0)] * 6
    load = Load(trajectories=[("A", 1, narrow) for _ in range(5)] + [("A", 1, [(8, 8, 0.0, 4.0)])], gpu=[], api=[])
    for policy in ("elastic", "fixed-dop"):
        h = Harness(policy, load)
        _assert_everything_started(h)
        # once aged, the wide action waits only for the narrow ones already running (1 s
        # each, plus the 0.1 s gap before a trajectory's next one); without the reservation,
        # narrow ones keep starting in front of it until their trajectories end
        waited_s = h.started_at_s["t5/0"] - h.submitted_at_s["t5/0"]
        aging_s = policy_params(policy)["aging_s"]
        assert waited_s <= aging_s + 1.0 + 0.2, f"{policy}: the wide action waited {waited_s:.2f} s, aging_s={aging_s}"
