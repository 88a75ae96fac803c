"""Core: the Scheduler, the one seam shared by the simulator and the live runtime.

``step(state, events, now)`` applies past-tense events to the state (shared bookkeeping),
asks the configured policy for decisions, and returns the new state, the decisions and
when it wants to be woken even if nothing happens. Pure: same inputs, same outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from arl_tangram.core import ledger
from arl_tangram.core.decisions import Decision
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import (
    ActionCancelled,
    ActionFinished,
    ActionSubmitted,
    EnvReady,
    EnvReleased,
    EnvRequested,
    Event,
    NodeLost,
    ServiceReady,
    describe,
)
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.state import ClusterState, QueuedAction, StateEditor, lane_of
from arl_tangram.core.topology import check_can_ever_fit


@dataclass(frozen=True)
class StepResult:
    state: ClusterState
    decisions: tuple[Decision, ...]
    wake_at: float | None


class Scheduler:
    """Drives one policy. Holds no mutable state of its own: all of it is in ``ClusterState``."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def bootstrap(self, state: ClusterState) -> StepResult:
        """Static placements a policy makes before any event (e.g. dedicated model deployments)."""
        ed = state.edit(state.now_s)
        decisions = tuple(self.policy.bootstrap(ed))
        return StepResult(ed.freeze(), decisions, None)

    def step(self, state: ClusterState, events: Sequence[Event], now: float) -> StepResult:
        ed = state.edit(max(now, state.now_s))
        decisions: list[Decision] = []
        cause = "wake"
        if not events:
            ed.touch(None)
        for event in events:
            cause = describe(event)
            decisions.extend(self._apply(ed, event, cause))
        if len(events) > 1:
            # The policy decides once for the whole round: its decisions name the round.
            cause = f"{cause} (+{len(events) - 1} more events this round)"
        decisions.extend(self.policy.schedule(ed, cause))
        return StepResult(ed.freeze(), tuple(decisions), self.policy.wake_at(ed))

    def _apply(self, ed: StateEditor, event: Event, cause: str) -> list[Decision]:
        if isinstance(event, ActionSubmitted):
            return self._submit(ed, event, cause)
        if isinstance(event, ActionFinished):
            run = ledger.finish_action(ed, event.action_id, event.exec_s)
            if run is not None:
                ed.touch(run.node_id)
        elif isinstance(event, ActionCancelled):
            if ed.find_queued(event.action_id) is not None:
                return [ledger.reject(ed, event.action_id, "cancelled by the client", cause)]
        elif isinstance(event, EnvRequested):
            if event.spec.env_id not in ed.envs:
                ledger.request_env(ed, event.spec)
        elif isinstance(event, EnvReady):
            env = ed.envs.get(event.env_id)
            if env is not None:
                ed.w("envs")[event.env_id] = replace(env, ready=True)
                ed.touch(env.node_id)
        elif isinstance(event, EnvReleased):
            released = ed.envs.get(event.env_id)
            ed.touch(released.node_id if released else None)
            ledger.release_env(ed, event.env_id)
            return self._reject_bound(ed, "env", event.env_id, "its env was released", cause)
        elif isinstance(event, ServiceReady):
            rep = ed.replicas.get(event.replica_id)
            if rep is not None:
                ed.w("replicas")[event.replica_id] = replace(rep, ready=True)
        elif isinstance(event, NodeLost):
            return self._lose_node(ed, event.node_id, cause)
        return []

    def _submit(self, ed: StateEditor, event: ActionSubmitted, cause: str) -> list[Decision]:
        spec = event.spec
        if ed.find_queued(spec.action_id) is not None or spec.action_id in ed.running:
            return [ledger.reject(ed, spec.action_id, "action_id: must be unique among live actions", cause)]
        try:
            check_can_ever_fit(spec, ed.spec)
        except SpecError as exc:
            return [ledger.reject(ed, spec.action_id, str(exc), cause)]
        if spec.binding.kind == "env" and spec.binding.name not in ed.envs:
            return [ledger.reject(ed, spec.action_id, f"binding.name: env {spec.binding.name!r} does not exist", cause)]
        ed.w(lane_of(spec.binding.kind))[spec.action_id] = QueuedAction(spec, ed.now_s, ed.next_seq())
        if spec.binding.kind == "service":
            ledger.note_service_request(ed, spec.binding.name)
        ed.touch(ed.envs[spec.binding.name].node_id if spec.binding.kind == "env" else None)
        return []

    def _reject_bound(self, ed: StateEditor, kind: str, name: str, why: str, cause: str) -> list[Decision]:
        lane = ed.queue_service if kind == "service" else ed.queue_api if kind == "api" else ed.queue_cpu
        doomed = [a for a, qa in lane.items() if qa.spec.binding.kind == kind and qa.spec.binding.name == name]
        return [ledger.reject(ed, a, why, cause) for a in doomed]

    def _lose_node(self, ed: StateEditor, node_id: str, cause: str) -> list[Decision]:
        decisions: list[Decision] = []
        ed.touch(None)
        # Its running actions are gone with it (their managers report them as errors).
        for aid in sorted(a for a, run in ed.running.items() if run.node_id == node_id):
            ledger.finish_action(ed, aid, None)
        for env_id in sorted(e for e, env in ed.envs.items() if env.node_id == node_id):
            ledger.release_env(ed, env_id)
            decisions.extend(self._reject_bound(ed, "env", env_id, f"node {node_id} was lost", cause))
        for rid in sorted(r for r, rep in ed.replicas.items() if rep.node_id == node_id):
            del ed.w("replicas")[rid]
        ed.w("cpu").pop(node_id, None)
        ed.w("gpu").pop(node_id, None)
        return decisions
