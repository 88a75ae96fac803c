"""The twin test: one recorded trace through the controller loop twice, once with a
simulated executor and once with the live node agent on real managers (sandboxes in
cgroups), both on a virtual clock. The decision logs must be identical: the loop, the
scheduler and the executor seam behave the same whether the work is simulated or real.

The live twin really creates each sandbox under the env id the core chose, really runs each
action with exactly the grant and NUMA split the decision named (and checks that the
action saw that many cpus), and really destroys each env; only the time an action takes
comes from the trace, so both twins see the same clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
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
from arl_tangram.core.elasticity import Amdahl
from arl_tangram.core.events import (
    ActionFinished,
    ActionSubmitted,
    EnvReady,
    EnvReleased,
    EnvRequested,
)
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec
from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.runtime.loop import ControllerLoop, Executor, ManualClock, Round
from tests.managers.cpu.conftest import IN_CI, host_can_sandbox

SMALL = SandboxSpec(mem_bytes=128 << 20, pids_max=64, workspace_bytes=16 << 20, tmp_bytes=16 << 20)
ENV_START_S = 0.05  # virtual: how long a sandbox takes to start, in both twins

# The recorded trace: per trajectory, its start and its actions (dop range, serial fraction,
# recorded duration, think time before it).
TRACE = [
    (0.0, [(1, 2, 0.0, 0.4, 0.0), (1, 1, 1.0, 0.2, 0.1), (1, 2, 0.2, 0.6, 0.3)]),
    (0.1, [(1, 2, 0.1, 0.5, 0.0), (2, 2, 0.0, 0.3, 0.2)]),
    (0.15, [(1, 1, 1.0, 0.7, 0.0), (1, 2, 0.5, 0.2, 0.05), (1, 1, 1.0, 0.1, 0.0)]),
    (0.2, [(1, 2, 0.0, 0.3, 0.0)]),
]


@dataclass
class Twin(Executor):
    """Drives the trace through a loop on a virtual clock; subclasses do the work."""

    cluster: ClusterSpec
    clock: ManualClock = field(default_factory=ManualClock)
    timers: list[tuple[float, int, object]] = field(default_factory=list)
    seq: Iterator[int] = field(default_factory=itertools.count)
    log: list[tuple[object, ...]] = field(default_factory=list)
    pending: dict[str, list[tuple[ActionSpec, float, float]]] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)

    def run(self) -> list[tuple[object, ...]]:
        loop = ControllerLoop(
            Scheduler(make_policy("elastic", depth=8)), ClusterState.initial(self.cluster), self.clock,
            check=True, log=self._record, on_wake=lambda t: self._at(t, None),
        )  # fmt: skip
        self.loop = loop
        loop.attach(self)
        for i, (start, actions) in enumerate(TRACE):
            env_id = f"twin-env-{i}"
            specs = []
            for k, (lo, hi, serial, duration, think) in enumerate(actions):
                spec = ActionSpec(
                    f"t{i}-a{k}", "test", Binding("env", env_id), demand_per_unit=ResourceVector(cpu_millicores=1000),
                    key=ResourceKind.CPU, dop_min=lo, dop_max=hi, elasticity=Amdahl(serial), t_ori_s=duration,
                )  # fmt: skip
                self.durations[spec.action_id] = duration / Amdahl(serial).speedup(1)
                specs.append((spec, think, duration))
            self.pending[env_id] = specs
            self._at(start, EnvRequested(EnvSpec(env_id, SMALL.mem_bytes), stimulus_id=f"traj-{i}"))
        while self.timers:
            t, _, what = heapq.heappop(self.timers)
            self.clock.now_s = max(self.clock.now_s, t)
            if isinstance(what, tuple):
                self._next_action(what[1])
            elif what is not None:
                loop.post(what)  # type: ignore[arg-type]
            if loop.due() and (not self.timers or self.timers[0][0] > self.clock.now_s):
                loop.run_round()
        return self.log

    def _at(self, t: float, what: object) -> None:
        heapq.heappush(self.timers, (t, next(self.seq), what))

    def _record(self, r: Round) -> None:
        for d in r.decisions:
            self.log.append(_summary(r.now_s, d))

    def _next_action(self, env_id: str) -> None:
        queue = self.pending.get(env_id)
        if queue:
            spec, think, _ = queue.pop(0)
            self._at(self.clock.now_s + think, ActionSubmitted(spec, stimulus_id=f"submit-{spec.action_id}"))
        else:
            self._at(self.clock.now_s + 0.01, EnvReleased(env_id, stimulus_id=f"done-{env_id}"))

    # -- the executor: virtual time, work done by the subclass -----------------------------
    def place_env(self, d: PlaceEnv) -> None:
        self.create(d)
        self._at(self.clock.now_s + ENV_START_S, EnvReady(d.env_id, stimulus_id=d.stimulus_id))
        self._next_action(d.env_id)

    def start_action(self, d: StartAction) -> None:
        self.execute(d)
        spec = self.loop.state.running[d.action_id].spec
        exec_s = spec.elasticity.duration_s(self.durations[d.action_id], d.dop)
        self._at(self.clock.now_s + exec_s, ActionFinished(d.action_id, "succeeded", exec_s, stimulus_id=d.stimulus_id))
        self._at(self.clock.now_s + exec_s, ("next", spec.binding.name))

    def release_env(self, d: ReleaseEnv) -> None:
        self.destroy(d)

    def load_service(self, d: LoadService) -> None:
        raise AssertionError("no services in this trace")

    def evict_service(self, d: EvictService) -> None:
        raise AssertionError("no services in this trace")

    def reject_action(self, d: RejectAction) -> None:
        raise AssertionError(f"nothing in this trace is rejected: {d}")

    def cancel_action(self, d: CancelAction) -> None:
        raise AssertionError("nothing in this trace is cancelled")

    def create(self, d: PlaceEnv) -> None: ...

    def execute(self, d: StartAction) -> None: ...

    def destroy(self, d: ReleaseEnv) -> None: ...


def _summary(now_s: float, d: Decision) -> tuple[object, ...]:
    if isinstance(d, StartAction):
        return (round(now_s, 6), "start", d.action_id, d.node_id, d.grant, d.dop, d.numa_millicores, d.stimulus_id, d.mem_limit_bytes)
    if isinstance(d, PlaceEnv):
        return (round(now_s, 6), "place", d.env_id, d.node_id, d.held, d.stimulus_id)
    if isinstance(d, ReleaseEnv):
        return (round(now_s, 6), "release", d.env_id, d.node_id, d.stimulus_id)
    return (round(now_s, 6), type(d).__name__, d)


class SimTwin(Twin):
    """Nothing real: the trace's times are all there is."""


@dataclass
class LiveTwin(Twin):
    """The live node agent's managers do the work for real, at once, in the test's thread."""

    agent: NodeAgent | None = None
    seen_cpus: dict[str, int] = field(default_factory=dict)

    def create(self, d: PlaceEnv) -> None:
        assert self.agent is not None and self.agent.cpu is not None
        assert d.node_id == self.agent.cpu_node_id
        self.agent.cpu.create_sandbox(SMALL, sandbox_id=d.env_id)

    def execute(self, d: StartAction) -> None:
        assert self.agent is not None and self.agent.cpu is not None
        env_id = self.loop.state.running[d.action_id].spec.binding.name
        r = self.agent.cpu.exec(
            env_id, "nproc", millicores=d.grant.cpu_millicores, numa_millicores=d.numa_millicores or None, dop=d.dop,
            mem_limit_bytes=d.mem_limit_bytes, on_memory_paused=lambda _usage: None,  # the grant on the env's cgroup
        )  # fmt: skip
        assert r.ok, (r.outcome, r.error, r.stderr)
        self.seen_cpus[d.action_id] = int(r.stdout_text)

    def destroy(self, d: ReleaseEnv) -> None:
        assert self.agent is not None and self.agent.cpu is not None
        self.agent.cpu.destroy_sandbox(d.env_id)


@pytest.fixture
def cpu_manager() -> Iterator[CpuManager]:
    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
    manager = CpuManager(CpuManagerConfig(default_spec=SMALL))
    yield manager
    manager.close()


def test_sim_and_live_twins_make_identical_decisions(cpu_manager: CpuManager) -> None:
    agent = NodeAgent("twin", cpu=cpu_manager)
    node = agent.cpu_node_spec()
    assert node is not None
    cluster = ClusterSpec(cpu_nodes=(node,))
    live = LiveTwin(cluster, agent=agent)
    sim = SimTwin(cluster)
    live_log, sim_log = live.run(), sim.run()
    assert len(sim_log) >= 2 * len(TRACE) + sum(len(a) for _, a in TRACE)  # places, starts, releases
    assert live_log == sim_log
    # The live twin really ran each action on exactly the cpus its decision named.
    starts = {entry[2]: entry[5] for entry in live_log if entry[1] == "start"}
    assert live.seen_cpus == starts
    assert any(dop == 2 for dop in starts.values())  # elastic grants happened
    # memory per action: every start carried a memory grant and the env's limit for the run
    assert all(e[4].mem_bytes > 0 and e[8] is not None for e in live_log if e[1] == "start")
    assert cpu_manager.list_sandboxes() == []  # every env destroyed
