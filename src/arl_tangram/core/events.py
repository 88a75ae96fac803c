"""Core: events, past-tense facts fed to ``Scheduler.step``. Frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

from arl_tangram.core.action import ActionSpec, EnvSpec

Outcome = str  # succeeded | failed | timed_out | oom_killed | cancelled | rejected | error
TERMINAL_OUTCOMES = ("succeeded", "failed", "timed_out", "oom_killed", "cancelled", "rejected", "error")


@dataclass(frozen=True)
class ActionSubmitted:
    spec: ActionSpec


@dataclass(frozen=True)
class ActionFinished:
    """A running action ended; ``exec_s`` is the measured execution time (feeds the estimator)."""

    action_id: str
    outcome: Outcome = "succeeded"
    exec_s: float | None = None


@dataclass(frozen=True)
class ActionCancelled:
    """The client withdrew a queued action (a running one ends with ActionFinished)."""

    action_id: str


@dataclass(frozen=True)
class EnvRequested:
    spec: EnvSpec


@dataclass(frozen=True)
class EnvReady:
    env_id: str


@dataclass(frozen=True)
class EnvReleased:
    env_id: str


@dataclass(frozen=True)
class ServiceReady:
    """A replica finished loading (swap-in from host memory) and can serve."""

    replica_id: str


@dataclass(frozen=True)
class NodeLost:
    """A node left: its queued work stays queued, its envs and replicas are gone."""

    node_id: str


Event = ActionSubmitted | ActionFinished | ActionCancelled | EnvRequested | EnvReady | EnvReleased | ServiceReady | NodeLost


def describe(event: Event) -> str:
    """A short, stable description of an event, carried by decisions as their cause."""
    name = type(event).__name__
    if isinstance(event, ActionSubmitted):
        return f"{name}({event.spec.action_id})"
    if isinstance(event, EnvRequested):
        return f"{name}({event.spec.env_id})"
    for attr in ("action_id", "env_id", "replica_id", "node_id"):
        if hasattr(event, attr):
            return f"{name}({getattr(event, attr)})"
    return name
