"""Core: decisions, imperative orders from the scheduler to the managers. Frozen dataclasses.

Every decision carries ``reason`` (why the policy chose it), ``cause`` (the event, or
``wake``, that triggered the round) and ``stimulus_id`` (the id of that stimulus; the events
an executor reports while carrying the decision out repeat it).
"""

from __future__ import annotations

from dataclasses import dataclass

from arl_tangram.core.resources import ResourceVector


@dataclass(frozen=True)
class StartAction:
    """Run the action on ``node_id`` with ``grant`` (on top of what its env holds) at ``dop``.

    For an env action under Allocate-on-Execution, the manager raises the env's cgroup to
    the grant for the action's life (the resize). ``cpuset_domains`` lists the millicores
    taken per NUMA domain. ``replica_id`` names the GPU replica that serves it; if that
    replica is still loading, the action starts when the load completes. ``attempt`` counts
    its starts (2 and up after ``RetryAction``); its ``ActionFinished`` repeats it.
    """

    action_id: str
    node_id: str
    grant: ResourceVector
    dop: int
    reason: str
    cause: str
    replica_id: str | None = None
    numa_millicores: tuple[int, ...] = ()
    stimulus_id: str = ""
    attempt: int = 1
    # Memory per action: the env's cgroup memory limit for the action's life (footprint +
    # grants, ``core.memory``), over which it pauses instead of dying. None: the env keeps
    # the limit it was created with and the kernel OOM-kills over it (a pod).
    mem_limit_bytes: int | None = None
    # CPU packing (``core.packing``): the cgroup's CPU limit when ``grant`` charges less (the
    # run may burst to its whole demand on a cpu it shares); None: the grant is the limit.
    cpu_limit_millicores: int | None = None


@dataclass(frozen=True)
class PlaceEnv:
    """Create the env's sandbox on ``node_id`` under ``env_id``; ``held`` stays reserved for
    the env's life (memory, plus fixed cores for pod-style policies, split over NUMA domains
    as ``numa_millicores``). The executor answers ``EnvReady`` or ``EnvFailed``."""

    env_id: str
    node_id: str
    held: ResourceVector
    reason: str
    cause: str
    numa_millicores: tuple[int, ...] = ()
    stimulus_id: str = ""


@dataclass(frozen=True)
class ReleaseEnv:
    """Destroy the env's sandbox; the core has already freed what it held."""

    env_id: str
    node_id: str | None
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class LoadService:
    """Restore ``service`` from host memory onto devices ``offset..offset+size-1`` of ``node_id``."""

    replica_id: str
    service: str
    node_id: str
    offset: int
    size: int
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class EvictService:
    """Drop the replica from its devices (its weights stay backed up in host memory)."""

    replica_id: str
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class RejectAction:
    """End an action that never ran, or whose node was lost, with ``outcome``: ``rejected``
    (invalid or can never fit), ``cancelled`` (withdrawn by its client) or ``error`` (its env
    failed or its node was lost; ``reason`` names the cause)."""

    action_id: str
    reason: str
    cause: str
    outcome: str = "rejected"
    stimulus_id: str = ""


@dataclass(frozen=True)
class CancelAction:
    """Stop a running action; its executor reports ``ActionFinished(cancelled)`` (or the
    outcome it reached first) and the core frees its grant then."""

    action_id: str
    node_id: str
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class RetryAction:
    """Attempt ``attempt`` of a retryable action was on ``node_id``, which is lost: the core
    has queued the action again (its arrival time and place kept) for attempt ``attempt + 1``.
    The executor drops whatever is left of the lost attempt; a result that attempt still
    reports must not end the action (the core ignores its ``ActionFinished``)."""

    action_id: str
    node_id: str
    attempt: int
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class PreemptAction:
    """Demote a running action below every action granted cores (``core.preemption``): the
    core has already given its cores back (its memory stays granted). The manager keeps the
    program running, unchanged, at the floor CPU priority on the node's cpus, so it uses
    only what granted actions leave idle; it ends as it would have (its ``ActionFinished``
    frees the rest). Idempotent: an action already demoted or ended is left alone.
    ``known_long``: the run was declared long (``preemption.declared_long``), so the
    manager demotes it at once, not only once it has used some CPU of its own."""

    action_id: str
    node_id: str
    reason: str
    cause: str
    stimulus_id: str = ""
    known_long: bool = False


@dataclass(frozen=True)
class PullImage:
    """Pull ``image`` into ``node_id``'s image store (fetch and unpack the layers it lacks).
    ``layers`` lists the digests this pull brings that no other pull on the node does
    (empty when the image's layers were unknown). The executor answers ``ImagePulled``
    (with every layer of the image) or ``ImagePullFailed``."""

    pull_id: str
    node_id: str
    image: str
    layers: tuple[str, ...]
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class GrowMemory:
    """Raise ``env_id``'s memory limit to ``limit_bytes`` (its footprint + its running
    actions' grants, never above its own limit): ``action_id``, paused at the old limit,
    resumes. Idempotent; no event answers it."""

    action_id: str
    node_id: str
    env_id: str
    limit_bytes: int
    grant_bytes: int  # the action's memory grant from now on
    reason: str
    cause: str
    stimulus_id: str = ""


@dataclass(frozen=True)
class OomKill:
    """End running ``action_id`` ``oom_killed``: past its env's limit, or picked to break a
    memory deadlock (``reason`` says which). The executor lets the kernel's OOM killer act
    on the env's cgroup (or kills the action) and reports ``ActionFinished(oom_killed)``."""

    action_id: str
    node_id: str
    env_id: str
    reason: str
    cause: str
    stimulus_id: str = ""


Decision = StartAction | PlaceEnv | ReleaseEnv | LoadService | EvictService | RejectAction | CancelAction | RetryAction | PullImage | PreemptAction | GrowMemory | OomKill
