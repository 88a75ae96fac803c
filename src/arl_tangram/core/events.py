"""Core: events, past-tense facts fed to ``Scheduler.step``. Frozen dataclasses.

Every event carries a ``stimulus_id``: the id of the stimulus (a submission, a completion, a
wake-up) that caused it. The controller loop gives each incoming stimulus a fresh id; every
decision a round makes repeats the id of the round's stimulus, and the events an executor
reports while carrying a decision out repeat the decision's id, so a decision log explains
itself end to end (Dask's ``stimulus_id``).

Managers report failures as events too (``EnvFailed``, ``ReplicaFailed``, ``NodeLost``):
the core never waits for something that will not happen.
"""

from __future__ import annotations

from dataclasses import dataclass

from arl_tangram.core.action import ActionSpec, EnvSpec, ServiceSpec
from arl_tangram.core.env_spec import LayerNeed
from arl_tangram.core.topology import CpuNodeSpec, GpuNodeSpec

Outcome = str  # succeeded | failed | timed_out | oom_killed | cancelled | rejected | error
TERMINAL_OUTCOMES = ("succeeded", "failed", "timed_out", "oom_killed", "cancelled", "rejected", "error")


@dataclass(frozen=True)
class ActionSubmitted:
    """A client submitted an action. ``submitted_s`` is its arrival time (queue time counts
    from there); None means the round's time."""

    spec: ActionSpec
    submitted_s: float | None = None
    stimulus_id: str = ""


@dataclass(frozen=True)
class ActionFinished:
    """A running action ended; ``exec_s`` is the measured execution time (feeds the estimator).

    ``attempt`` repeats the ``StartAction``'s: a report of an earlier attempt (one whose node
    was lost, the action since queued again) is ignored. None: whichever attempt runs (for
    executors that never lose a node).
    """

    action_id: str
    outcome: Outcome = "succeeded"
    exec_s: float | None = None
    stimulus_id: str = ""
    attempt: int | None = None
    peak_mem_bytes: int | None = None  # the run's own peak memory (feeds the per-kind demand)
    paused_s: float = 0.0  # how long its manager kept it paused (queue time, not execution)
    cpu_s: float | None = None  # CPU seconds its processes used (feeds ``core.packing``)


@dataclass(frozen=True)
class ActionCancelled:
    """The client withdrew an action. A queued one ends ``cancelled`` in the core; a running
    one is stopped by its executor, which then reports ``ActionFinished(cancelled)``."""

    action_id: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class EnvRequested:
    spec: EnvSpec
    stimulus_id: str = ""


@dataclass(frozen=True)
class EnvReady:
    env_id: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class EnvFailed:
    """The env's sandbox failed to start, or died. Its queued actions end as ``error``; its
    running actions are ended by their executor."""

    env_id: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class EnvReleased:
    """The client is done with the env: the core frees it and orders ``ReleaseEnv``."""

    env_id: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class ServiceReady:
    """A replica finished loading (swap-in from host memory) and can serve."""

    replica_id: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class ReplicaFailed:
    """A replica failed to load, or was lost. Its devices are free again; actions started on
    it are ended by their executor."""

    replica_id: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class ServiceRegistered:
    """A GPU service can be requested from now on (its weights are backed up in host memory)."""

    service: ServiceSpec
    stimulus_id: str = ""


@dataclass(frozen=True)
class NodeJoined:
    """A node offers capacity (at start, or later): the scheduler may place on it at once."""

    node: CpuNodeSpec | GpuNodeSpec
    stimulus_id: str = ""


@dataclass(frozen=True)
class NodeLost:
    """A node left: its running actions end as ``error`` (cause ``node_lost``), except
    retryable ones whose env (if any) is elsewhere, which are queued again; its envs are
    lost, its replicas gone; queued work that is not bound to a lost env stays queued."""

    node_id: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class NodeLayersChanged:
    """The image layers ``node_id`` holds now (all of them: they replace what the core
    knew), reported when it joins and after its store collected layers."""

    node_id: str
    layers: tuple[LayerNeed, ...]
    stimulus_id: str = ""


@dataclass(frozen=True)
class ImagePulled:
    """A ``PullImage`` landed: ``layers`` are every layer of ``image`` (lowest first), now
    on the node; ``fetched_bytes`` were fetched and unpacked in ``exec_s`` (the node's
    measured bandwidth)."""

    pull_id: str
    node_id: str
    image: str
    layers: tuple[LayerNeed, ...]
    exec_s: float | None = None
    fetched_bytes: int = 0
    stimulus_id: str = ""


@dataclass(frozen=True)
class ImagePullFailed:
    """A ``PullImage`` failed; ``cause`` names the layer (``layer``, when one was at fault)
    and the registry's answer. The envs that needed it end ``error`` with that cause."""

    pull_id: str
    node_id: str
    image: str
    cause: str
    layer: str = ""
    stimulus_id: str = ""


@dataclass(frozen=True)
class PrefetchRequested:
    """A client asks for ``image`` to be pulled onto ``node_ids`` (every CPU node when
    empty) ahead of the envs that will need it. ``layers``, when known, let the core skip
    nodes that hold them already."""

    image: str
    node_ids: tuple[str, ...] = ()
    layers: tuple[LayerNeed, ...] = ()
    stimulus_id: str = ""


@dataclass(frozen=True)
class EnvFootprint:
    """The node measured ``env_id``'s idle footprint (resident + unreclaimable page cache,
    tmpfs included), between actions. The core smooths it and charges it to the node."""

    env_id: str
    footprint_bytes: int
    stimulus_id: str = ""


@dataclass(frozen=True)
class ActionMemoryPaused:
    """``action_id``'s env reached its cgroup limit (footprint + grants) and its processes
    wait in the kernel instead of being OOM-killed; ``usage_bytes`` is the env's usage then.
    The core answers ``GrowMemory``, keeps it waiting, or ``OomKill``."""

    action_id: str
    usage_bytes: int = 0
    stimulus_id: str = ""


@dataclass(frozen=True)
class NodeMemoryPressure:
    """The node measured its memory: ``free_bytes`` really available to its sandboxes (its
    budget less their usage, reclaimable page cache counted free) and, where the kernel has
    PSI, ``some_avg10`` (percent of the last 10 s some task stalled on memory; None: no PSI).
    Sent periodically; the core admits no more than it says is free (``core.mem_pressure``)."""

    node_id: str
    free_bytes: int
    some_avg10: float | None = None
    stimulus_id: str = ""


Event = (
    ActionSubmitted | ActionFinished | ActionCancelled | EnvRequested | EnvReady | EnvFailed
    | EnvReleased | ServiceReady | ReplicaFailed | ServiceRegistered | NodeJoined | NodeLost
    | NodeLayersChanged | ImagePulled | ImagePullFailed | PrefetchRequested | EnvFootprint | ActionMemoryPaused
    | NodeMemoryPressure
)  # fmt: skip


def describe(event: Event) -> str:
    """A short, stable description of an event, carried by decisions as their cause."""
    name = type(event).__name__
    if isinstance(event, ActionSubmitted):
        return f"{name}({event.spec.action_id})"
    if isinstance(event, EnvRequested):
        return f"{name}({event.spec.env_id})"
    if isinstance(event, NodeJoined):
        return f"{name}({event.node.node_id})"
    if isinstance(event, ServiceRegistered):
        return f"{name}({event.service.name})"
    if isinstance(event, PrefetchRequested):
        return f"{name}({event.image})"
    for attr in ("action_id", "env_id", "pull_id", "replica_id", "node_id"):
        if hasattr(event, attr):
            return f"{name}({getattr(event, attr)})"
    return name
