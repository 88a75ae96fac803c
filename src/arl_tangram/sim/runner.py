"""Sim: one simulated RL step: a workload's trajectories driven through a policy on a cluster.

The controller loop is the live system's own (``runtime.loop``) on a virtual clock: the
event queue fires what is due, the loop steps the scheduler and hands the decisions to the
simulated managers, its executor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.events import ActionSubmitted, EnvReleased, EnvRequested
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec
from arl_tangram.runtime.loop import ControllerLoop, Round
from arl_tangram.sim.engine import EventQueue
from arl_tangram.sim.managers import SimManagers
from arl_tangram.sim.metrics import ActionRecord, Metrics
from arl_tangram.sim.platform import Platform
from arl_tangram.sim.workload import ActionTemplate, TrajectoryPlan, Workload


@dataclass
class RunResult:
    policy: str
    platform: str
    metrics: Metrics
    rounds: int
    decisions: list[Any]


class VirtualClock:
    """The simulator's clock: the event queue's virtual time."""

    def __init__(self, queue: EventQueue) -> None:
        self.queue = queue

    def now(self) -> float:
        return self.queue.now_s


class _Trajectory:
    def __init__(self, plan: TrajectoryPlan) -> None:
        self.plan = plan
        self.phase = 0


class Simulation:
    """Runs one workload once. ``check=True`` validates the state invariants after every round."""

    def __init__(
        self,
        cluster: ClusterSpec,
        policy: Policy,
        platform: Platform,
        workload: Workload,
        seed: int = 0,
        check: bool = False,
        keep_decisions: bool = False,
    ) -> None:
        self.cluster = cluster
        self.scheduler = Scheduler(policy)
        self.platform = platform
        self.workload = workload
        self.q = EventQueue()
        self.metrics = Metrics()
        self.templates: dict[str, ActionTemplate] = {}
        self.trajectories: dict[str, _Trajectory] = {}
        self.owner: dict[str, str] = {}  # action id -> trajectory id
        self.decisions: list[Any] = []
        self.loop = ControllerLoop(
            self.scheduler, ClusterState.initial(cluster), VirtualClock(self.q), check=check,
            log=self._log if keep_decisions else None, on_wake=lambda t: self.q.at(t, _advance),
        )  # fmt: skip
        self.managers = SimManagers(self.q, cluster, platform, self.metrics, self.templates, self.loop.post, self._action_done, seed)
        self.loop.attach(self.managers)

    @property
    def state(self) -> ClusterState:
        return self.loop.state

    def run(self) -> RunResult:
        self.managers.instant_loads = True  # static deployments are up before the step
        self.loop.bootstrap()
        self.managers.instant_loads = False
        for plan in self.workload.trajectories:
            self.q.at(plan.start_s, functools.partial(self._start_trajectory, plan))
        while self.q or self.loop.pending:
            for callback in self.q.pop_due():
                callback()
            if self.loop.due():
                self.loop.run_round()
        self.managers.close()
        # The bootstrap is not a round of the step.
        return RunResult(self.scheduler.policy.name, self.platform.name, self.metrics, self.loop.rounds - 1, self.decisions)

    def _log(self, entry: Round) -> None:
        self.decisions.extend(entry.decisions)

    def _start_trajectory(self, plan: TrajectoryPlan) -> None:
        traj = _Trajectory(plan)
        self.trajectories[plan.trajectory_id] = traj
        if plan.env_mem_bytes is not None:
            self.loop.post(EnvRequested(EnvSpec(self._env_id(plan), plan.env_mem_bytes, plan.tenant, plan.trajectory_id)))
        self._next_phase(traj)

    @staticmethod
    def _env_id(plan: TrajectoryPlan) -> str:
        return f"env-{plan.trajectory_id}"

    def _next_phase(self, traj: _Trajectory) -> None:
        plan = traj.plan
        if traj.phase >= len(plan.phases):
            self.metrics.trajectory_end_s[plan.trajectory_id] = self.q.now_s
            if plan.env_mem_bytes is not None:
                self.loop.post(EnvReleased(self._env_id(plan)))
            return
        think_s, tpl = plan.phases[traj.phase]
        action_id = f"{plan.trajectory_id}/{traj.phase}"
        traj.phase += 1
        self.q.after(think_s, lambda: self._submit(plan, action_id, tpl))

    def _submit(self, plan: TrajectoryPlan, action_id: str, tpl: ActionTemplate) -> None:
        binding = Binding("env", self._env_id(plan)) if tpl.binding_kind == "env" else Binding(tpl.binding_kind, tpl.binding_name)  # type: ignore[arg-type]
        spec = ActionSpec(
            action_id, tpl.kind, binding, plan.tenant, plan.trajectory_id, tpl.fixed, tpl.per_unit,
            tpl.key, tpl.dop_min, tpl.dop_max, tpl.declared_elasticity, None, memory_bytes=tpl.memory_bytes,
        )
        self.templates[action_id] = tpl
        self.owner[action_id] = plan.trajectory_id
        self.metrics.actions[action_id] = ActionRecord(action_id, tpl.kind, tpl.category, self.q.now_s)
        self.loop.post(ActionSubmitted(spec))

    def _action_done(self, action_id: str, outcome: str) -> None:
        traj = self.trajectories[self.owner[action_id]]
        self._next_phase(traj)


def _advance() -> None:
    """An entry at a wake-up time: the queue moves the clock there, then the loop is due."""
