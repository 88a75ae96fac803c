"""Sim: one simulated RL step: a workload's trajectories driven through a policy on a cluster.

The loop is the controller loop of the live system on a virtual clock: collect the
events due now, ``scheduler.step``, hand the decisions to the (simulated) managers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.events import ActionSubmitted, EnvReleased, EnvRequested, Event
from arl_tangram.core.invariants import validate
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec
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
        self.check = check
        self.keep_decisions = keep_decisions
        self.q = EventQueue()
        self.metrics = Metrics()
        self.templates: dict[str, ActionTemplate] = {}
        self.pending: list[Event] = []
        self.state = ClusterState.initial(cluster)
        self.trajectories: dict[str, _Trajectory] = {}
        self.owner: dict[str, str] = {}  # action id -> trajectory id
        self.managers = SimManagers(self.q, cluster, platform, self.metrics, self.templates, self.pending.append, self._action_done, seed)
        self._woken = False
        self._wakes: set[float] = set()
        self.rounds = 0
        self.decisions: list[Any] = []

    def run(self) -> RunResult:
        boot = self.scheduler.bootstrap(self.state)
        self.state = boot.state
        self.managers.apply(boot.decisions, instant_loads=True)  # static deployments are up before the step
        for plan in self.workload.trajectories:
            self.q.at(plan.start_s, functools.partial(self._start_trajectory, plan))
        while self.q or self.pending:
            for callback in self.q.pop_due():
                callback()
            self._round()
        self.managers.close()
        return RunResult(self.scheduler.policy.name, self.platform.name, self.metrics, self.rounds, self.decisions)

    def _round(self) -> None:
        events, self.pending[:] = list(self.pending), []
        if not events and not self._woken:
            return
        self._woken = False
        result = self.scheduler.step(self.state, events, self.q.now_s)
        self.rounds += 1
        self.state = result.state
        if self.check:
            validate(self.state)
        if self.keep_decisions:
            self.decisions.extend(result.decisions)
        self.managers.apply(result.decisions)
        if result.wake_at is not None and result.wake_at not in self._wakes:
            self._wakes.add(result.wake_at)
            self.q.at(result.wake_at, self._wake)

    def _wake(self) -> None:
        self._woken = True

    def _start_trajectory(self, plan: TrajectoryPlan) -> None:
        traj = _Trajectory(plan)
        self.trajectories[plan.trajectory_id] = traj
        if plan.env_mem_bytes is not None:
            self.pending.append(EnvRequested(EnvSpec(self._env_id(plan), plan.env_mem_bytes, plan.tenant, plan.trajectory_id)))
        self._next_phase(traj)

    @staticmethod
    def _env_id(plan: TrajectoryPlan) -> str:
        return f"env-{plan.trajectory_id}"

    def _next_phase(self, traj: _Trajectory) -> None:
        plan = traj.plan
        if traj.phase >= len(plan.phases):
            self.metrics.trajectory_end_s[plan.trajectory_id] = self.q.now_s
            if plan.env_mem_bytes is not None:
                self.pending.append(EnvReleased(self._env_id(plan)))
                self.managers.release_env(self._env_id(plan))
            return
        think_s, tpl = plan.phases[traj.phase]
        action_id = f"{plan.trajectory_id}/{traj.phase}"
        traj.phase += 1
        self.q.after(think_s, lambda: self._submit(plan, action_id, tpl))

    def _submit(self, plan: TrajectoryPlan, action_id: str, tpl: ActionTemplate) -> None:
        binding = Binding("env", self._env_id(plan)) if tpl.binding_kind == "env" else Binding(tpl.binding_kind, tpl.binding_name)  # type: ignore[arg-type]
        spec = ActionSpec(
            action_id, tpl.kind, binding, plan.tenant, plan.trajectory_id, tpl.fixed, tpl.per_unit,
            tpl.key, tpl.dop_min, tpl.dop_max, tpl.declared_elasticity, None,
        )
        self.templates[action_id] = tpl
        self.owner[action_id] = plan.trajectory_id
        self.metrics.actions[action_id] = ActionRecord(action_id, tpl.kind, tpl.category, self.q.now_s)
        self.pending.append(ActionSubmitted(spec))

    def _action_done(self, action_id: str, outcome: str) -> None:
        traj = self.trajectories[self.owner[action_id]]
        self._next_phase(traj)
