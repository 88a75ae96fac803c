"""Core: the Scheduler, the one seam shared by the simulator and the live runtime.

``step(state, events, now)`` applies past-tense events to the state (shared bookkeeping),
asks the configured policy for decisions, and returns the new state, the decisions and
when it wants to be woken even if nothing happens. Pure: same inputs, same outputs.

A lost node's running actions end ``error`` (``node_lost``), except retryable ones whose
env did not go with it: those are queued again (``RetryAction``), up to ``MAX_ATTEMPTS``
starts in all; a late ``ActionFinished`` of an earlier attempt is ignored.

Every decision repeats a stimulus id: the decisions an event causes directly (a rejection,
an env release, the outcomes of a lost node) carry that event's id; the policy's decisions
carry the round's stimulus (the id of its only event, or of all of them joined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from arl_tangram.core import env_flow, images, ledger, mem_pressure, memory, packing
from arl_tangram.core.decisions import CancelAction, Decision, RetryAction
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import (
    ActionCancelled,
    ActionFinished,
    ActionMemoryPaused,
    ActionSubmitted,
    EnvFailed,
    EnvFootprint,
    EnvReady,
    EnvReleased,
    EnvRequested,
    Event,
    ImagePulled,
    ImagePullFailed,
    NodeJoined,
    NodeLayersChanged,
    NodeLost,
    NodeMemoryPressure,
    PrefetchRequested,
    ReplicaFailed,
    ServiceReady,
    ServiceRegistered,
    describe,
)
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.state import ClusterState, Running, StateEditor
from arl_tangram.core.topology import add_node, add_service, check_can_ever_fit

MAX_JOINED_STIMULI = 4  # a round of more events names its first ids and a count
MAX_ATTEMPTS = 3  # a retryable action starts at most this often (2 retries after node losses)


@dataclass(frozen=True)
class StepResult:
    state: ClusterState
    decisions: tuple[Decision, ...]
    wake_at: float | None


def round_stimulus(events: Sequence[Event]) -> str:
    """The stimulus id a round's policy decisions carry: its events' ids, or ``wake``."""
    # An event repeats the id of the decision it answers, which may itself name a round:
    # keep each id's first stimulus only (deduplicated), or the ids of a busy loop nest
    # round after round and grow without bound (a memory-bench run reached 22 GB).
    ids = list(dict.fromkeys(e.stimulus_id.split("+", 1)[0] for e in events if e.stimulus_id))
    if not ids:
        return "wake" if not events else ""
    if len(ids) <= MAX_JOINED_STIMULI:
        return "+".join(ids)
    return "+".join(ids[:MAX_JOINED_STIMULI]) + f"+{len(ids) - MAX_JOINED_STIMULI} more"


def _tag(decisions: list[Decision], stimulus_id: str) -> list[Decision]:
    if not stimulus_id:
        return decisions
    return [replace(d, stimulus_id=stimulus_id) for d in decisions]


class Scheduler:
    """Drives one policy. Holds no mutable state of its own: all of it is in ``ClusterState``."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def bootstrap(self, state: ClusterState) -> StepResult:
        """Static placements a policy makes before any event (e.g. dedicated model deployments)."""
        ed = state.edit(state.now_s)
        decisions = _tag(list(self.policy.bootstrap(ed)), "bootstrap")
        return StepResult(ed.freeze(), tuple(decisions), None)

    def step(self, state: ClusterState, events: Sequence[Event], now: float) -> StepResult:
        ed = state.edit(max(now, state.now_s))
        env_flow.advance(ed, state.now_s)
        decisions: list[Decision] = []
        cause = "wake"
        if not events:
            ed.touch(None)
        for event in events:
            cause = describe(event)
            decisions.extend(_tag(self._apply(ed, event, cause), event.stimulus_id))
        if len(events) > 1:
            # The policy decides once for the whole round: its decisions name the round.
            cause = f"{cause} (+{len(events) - 1} more events this round)"
        decisions.extend(_tag(self.policy.schedule(ed, cause), round_stimulus(events)))
        return StepResult(ed.freeze(), tuple(decisions), self.policy.wake_at(ed))

    def _apply(self, ed: StateEditor, event: Event, cause: str) -> list[Decision]:
        if isinstance(event, ActionSubmitted):
            return self._submit(ed, event, cause)
        if isinstance(event, ActionFinished):
            run = ed.running.get(event.action_id)
            if run is not None and event.attempt not in (None, run.attempt):
                return []  # an earlier attempt's late report: that attempt is already over
            run = ledger.finish_action(ed, event.action_id, event.exec_s)
            if run is not None:
                memory.observe_peak(ed, run.spec.kind, event.peak_mem_bytes)
                packing.observe(ed, run, event.cpu_s, event.paused_s)
                ed.touch(run.node_id)
        elif isinstance(event, ActionCancelled):
            return self._cancel(ed, event.action_id, cause)
        elif isinstance(event, EnvRequested):
            if event.spec.env_id not in ed.envs:
                ledger.request_env(ed, event.spec)
        elif isinstance(event, EnvReady):
            env = ed.envs.get(event.env_id)
            if env is not None and event.env_id not in ed.env_pulls:  # no sandbox before its layers
                ed.w("envs")[event.env_id] = replace(env, ready=True)
                ed.touch(env.node_id)
        elif isinstance(event, EnvReleased):
            return self._end_env(ed, event.env_id, "released by its client", "cancelled", cause)
        elif isinstance(event, EnvFailed):
            return self._end_env(ed, event.env_id, f"env_failed: {event.cause}", "error", cause)
        elif isinstance(event, ServiceReady):
            rep = ed.replicas.get(event.replica_id)
            if rep is not None:
                ed.w("replicas")[event.replica_id] = replace(rep, ready=True)
        elif isinstance(event, ReplicaFailed):
            running = sorted(a for a, run in ed.running.items() if run.replica_id == event.replica_id)
            ended = self._end_running(ed, running, f"replica_failed: {event.cause}", cause)
            if ledger.drop_replica(ed, event.replica_id) is not None:
                ed.touch(None)
            return ended
        elif isinstance(event, ServiceRegistered):
            ed.spec = add_service(ed.spec, event.service)
        elif isinstance(event, NodeJoined):
            self._join_node(ed, event)
        elif isinstance(event, NodeLost):
            return self._lose_node(ed, event.node_id, cause)
        else:
            return self._apply_image(ed, event, cause)
        return []

    def _apply_image(self, ed: StateEditor, event: Event, cause: str) -> list[Decision]:
        """Image locality and pulls (``core.images``); a failed pull ends its envs here."""
        if isinstance(event, NodeLayersChanged):
            images.on_layers_changed(ed, event)
            ed.touch(event.node_id)
        elif isinstance(event, ImagePulled):
            ed.touch(event.node_id)
            return images.on_pulled(ed, event, cause)
        elif isinstance(event, ImagePullFailed):
            doomed, decisions = images.on_pull_failed(ed, event, cause)
            for env_id in doomed:
                decisions += self._end_env(ed, env_id, f"image_pull_failed: {event.cause}", "error", cause)
            return decisions
        elif isinstance(event, PrefetchRequested):
            return images.prefetch(ed, event, cause)
        elif isinstance(event, EnvFootprint):
            memory.observe_footprint(ed, event.env_id, event.footprint_bytes)
            env = ed.envs.get(event.env_id)
            ed.touch(env.node_id if env else None)
        elif isinstance(event, ActionMemoryPaused):
            memory.on_paused(ed, event.action_id, event.usage_bytes)
        elif isinstance(event, NodeMemoryPressure):
            mem_pressure.on_report(ed, event.node_id, event.free_bytes, event.some_avg10)
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
        if spec.binding.kind == "env" and spec.memory_bytes is not None and spec.memory_bytes > ed.envs[spec.binding.name].spec.mem_bytes:
            limit = ed.envs[spec.binding.name].spec.mem_bytes
            return [ledger.reject(ed, spec.action_id, f"memory: must be <= the env's memory limit ({limit} bytes)", cause)]
        arrived_s = ed.now_s if event.submitted_s is None else min(event.submitted_s, ed.now_s)
        ledger.enqueue(ed, spec, arrived_s)
        if spec.binding.kind == "service":
            ledger.note_service_request(ed, spec.binding.name)
        ed.touch(ed.envs[spec.binding.name].node_id if spec.binding.kind == "env" else None)
        return []

    def _cancel(self, ed: StateEditor, action_id: str, cause: str) -> list[Decision]:
        """A queued action ends here; a running one is stopped by its executor (which then
        reports it finished); an unknown or ended one is left alone (idempotent)."""
        if ed.find_queued(action_id) is not None:
            return [ledger.reject(ed, action_id, "cancelled by its client", cause, "cancelled")]
        if action_id in ed.running:
            return [CancelAction(action_id, ed.running[action_id].node_id, "cancelled by its client", cause)]
        return []

    def _end_running(
        self, ed: StateEditor, action_ids: list[str], why: str, cause: str, outcome: str = "error"
    ) -> list[Decision]:
        """End running actions whose env, replica or node is gone, once, here (``error``, or
        ``cancelled`` when their client released the env); the executor stops whatever is
        left of them, and what it reports later changes nothing."""
        decisions: list[Decision] = []
        for aid in action_ids:
            ledger.finish_action(ed, aid, None)
            decisions.append(ledger.reject(ed, aid, why, cause, outcome))
        return decisions

    def _end_env(self, ed: StateEditor, env_id: str, why: str, outcome: str, cause: str) -> list[Decision]:
        """Free an env and end its queued and running actions with ``outcome``."""
        released = ed.envs.get(env_id)
        ed.touch(released.node_id if released else None)
        decisions = self._end_running(ed, list(ed.env_busy.get(env_id, ())), why, cause, outcome)
        decisions += self._reject_bound(ed, "env", env_id, why, outcome, cause)
        order = ledger.release_env(ed, env_id, why, cause)
        if order is not None:
            decisions.append(order)
        return decisions

    def _reject_bound(self, ed: StateEditor, kind: str, name: str, why: str, outcome: str, cause: str) -> list[Decision]:
        lane = ed.queue_service if kind == "service" else ed.queue_api if kind == "api" else ed.queue_cpu
        doomed = [a for a, qa in lane.items() if qa.spec.binding.kind == kind and qa.spec.binding.name == name]
        return [ledger.reject(ed, a, why, cause, outcome) for a in doomed]

    def _join_node(self, ed: StateEditor, event: NodeJoined) -> None:
        try:
            ed.spec = add_node(ed.spec, event.node)
        except SpecError:
            return  # already known: a repeated join changes nothing
        ed.add_node_tables(event.node)
        ed.touch(None)

    def _lose_node(self, ed: StateEditor, node_id: str, cause: str) -> list[Decision]:
        decisions: list[Decision] = []
        ed.touch(None)
        mem_pressure.forget_node(ed, node_id)
        why = f"node_lost: node {node_id} was lost"
        # Nobody is left to report these actions: the core ends them (or queues them again), once.
        on_node = sorted(a for a, run in ed.running.items() if run.node_id == node_id)
        retried = [a for a in on_node if self._may_retry(ed, ed.running[a], node_id)]
        for aid in retried:
            run = ledger.finish_action(ed, aid, None)
            assert run is not None
            ledger.requeue(ed, run)
            again = f"{why}; queued again for attempt {run.attempt + 1} of {MAX_ATTEMPTS}"
            decisions.append(RetryAction(aid, node_id, run.attempt, again, cause))
        for aid in (a for a in on_node if a not in retried):
            run = ed.running[aid]
            tries = f" (attempt {run.attempt} of {MAX_ATTEMPTS})" if run.spec.retryable else ""
            decisions += self._end_running(ed, [aid], why + tries, cause)
        pulling = set(images.drop_node(ed, node_id))
        for env_id in sorted(e for e, env in ed.envs.items() if env.node_id == node_id):
            decisions.extend(self._reject_bound(ed, "env", env_id, why, "error", cause))
            order = ledger.release_env(ed, env_id, why, cause)  # nothing left to destroy there
            if order is not None and env_id in pulling:  # no sandbox, no pull to answer it: the core does
                decisions.append(replace(order, node_id=None))
        for rid in sorted(r for r, rep in ed.replicas.items() if rep.node_id == node_id):
            del ed.w("replicas")[rid]
        ed.w("cpu").pop(node_id, None)
        ed.w("gpu").pop(node_id, None)
        ed.spec = ed.spec.without_node(node_id)
        return decisions

    @staticmethod
    def _may_retry(ed: StateEditor, run: Running, node_id: str) -> bool:
        """A running action on lost ``node_id`` goes back to the queue when its client marked
        it retryable, it has attempts left, and its env (if any) is not on that node (an
        env's state is not reproducible elsewhere: those end ``node_lost``)."""
        if not run.spec.retryable or run.attempt >= MAX_ATTEMPTS:
            return False
        if run.spec.binding.kind != "env":
            return True
        env = ed.envs.get(run.spec.binding.name)
        return env is not None and env.node_id != node_id
