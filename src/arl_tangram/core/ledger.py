"""Core: the bookkeeping operations every policy shares (start, finish, place, load, evict).

Each function applies one change to a ``StateEditor`` and returns the decision that tells
the managers to carry it out, so accounting and decisions can never drift apart.
Callers (policies) check feasibility first; these functions do not re-check capacity,
``invariants.validate`` does.
"""

from __future__ import annotations

from dataclasses import replace

from arl_tangram.core import env_flow, memory
from arl_tangram.core.action import ActionSpec, EnvSpec
from arl_tangram.core.decisions import (
    EvictService,
    LoadService,
    PlaceEnv,
    RejectAction,
    ReleaseEnv,
    StartAction,
)
from arl_tangram.core.fair_share import note_held, note_queued, share_units
from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import EnvState, QueuedAction, Replica, Running, StateEditor, lane_of

DEFAULT_T_ORI_S = 1.0  # prior for an action kind never seen and given no estimate
DEMAND_HALF_LIFE_S = 60.0  # how fast a service's request count forgets: a minute of RL rollout


def _decayed(value: float, since_s: float, now_s: float) -> float:
    return value * 0.5 ** (max(0.0, now_s - since_s) / DEMAND_HALF_LIFE_S)


def note_service_request(ed: StateEditor, service: str) -> None:
    """Count one request to ``service`` in its decayed demand (for eviction choices)."""
    value, since = ed.service_demand.get(service, (0.0, ed.now_s))
    ed.w("service_demand")[service] = (_decayed(value, since, ed.now_s) + 1.0, ed.now_s)


def service_demand(ed: StateEditor, service: str) -> float:
    value, since = ed.service_demand.get(service, (0.0, ed.now_s))
    return _decayed(value, since, ed.now_s)


def estimated_t_ori(ed: StateEditor, qa: QueuedAction) -> float:
    """Client estimate if given, else the online mean of the kind, else the prior."""
    if qa.spec.t_ori_s is not None:
        return qa.spec.t_ori_s
    n_mean = ed.estimates.get(qa.spec.kind)
    return n_mean[1] if n_mean else DEFAULT_T_ORI_S


def observe_duration(ed: StateEditor, run: Running, exec_s: float) -> None:
    """Feed a measured execution time back into the per-kind T_ori estimate (running mean)."""
    if exec_s <= 0:
        return
    t_ori = exec_s * run.spec.elasticity.speedup(run.dop)
    n, mean = ed.estimates.get(run.spec.kind, (0, 0.0))
    ed.w("estimates")[run.spec.kind] = (n + 1, mean + (t_ori - mean) / (n + 1))


def note_deadline(ed: StateEditor, lane: str, spec: ActionSpec, delta: int) -> None:
    """Count an action with a deadline into (+1) or out of (-1) ``queue_cpu``
    (``ClusterState.queued_deadlines``)."""
    if lane == "queue_cpu" and spec.deadline_s is not None:
        ed.queued_deadlines += delta


def enqueue(ed: StateEditor, spec: ActionSpec, arrived_s: float) -> QueuedAction:
    """Queue an accepted action at the end of its lane (FCFS within its tenant)."""
    lane = lane_of(spec.binding.kind)
    qa = QueuedAction(spec, arrived_s, ed.next_seq())
    ed.w(lane)[spec.action_id] = qa
    note_queued(ed, lane, spec.tenant, +1)
    note_deadline(ed, lane, spec, +1)
    if spec.binding.kind == "env":
        env_flow.note_submitted(ed, spec, estimated_t_ori(ed, qa))
    return qa


def start_action(
    ed: StateEditor,
    qa: QueuedAction,
    node_id: str,
    dop: int,
    reason: str,
    cause: str,
    *,
    grant: ResourceVector | None = None,
    replica_id: str | None = None,
    extra_delay_s: float = 0.0,
    mem_bytes: int | None = None,
    cpu_charge_mc: int | None = None,
) -> StartAction:
    """Move a queued action to running on ``node_id`` at ``dop``.

    ``grant`` defaults to the spec's demand at ``dop``; CPU and memory of the grant are taken
    from the node, quota tokens from the bound provider. ``extra_delay_s`` (e.g. a replica
    still loading) only shifts the expected end used by the completion-time heap. On an env
    charged per action the memory grant comes on top: ``mem_bytes`` (the policy's), else
    ``memory.action_grant``. ``cpu_charge_mc`` (``core.packing``): the millicores the node is
    charged instead of the demand, which stays the run's CPU limit.
    """
    spec = qa.spec
    grant = spec.demand_at(dop) if grant is None else grant
    cpu_limit = None
    if cpu_charge_mc is not None and cpu_charge_mc < grant.cpu_millicores:
        cpu_limit = grant.cpu_millicores
        grant = replace(grant, cpu_millicores=cpu_charge_mc)
    env = ed.envs.get(spec.binding.name) if spec.binding.kind == "env" else None
    per_action = env is not None and env.per_action_memory
    if per_action:
        assert env is not None
        mem = memory.action_grant(ed, env, spec.memory_bytes, spec.kind) if mem_bytes is None else mem_bytes
        grant = grant + ResourceVector(mem_bytes=mem)
    numa: tuple[int, ...] = ()
    if grant.cpu_millicores or grant.mem_bytes:
        numa = ed.take_cpu(node_id, grant)
    if spec.binding.kind == "api" and grant.quota_tokens:
        ed.take_quota(spec.binding.name, grant.quota_tokens)
    duration = spec.duration_s(estimated_t_ori(ed, qa), dop)
    ed.w("running")[spec.action_id] = Running(
        spec, node_id, grant, dop, qa.submitted_s, ed.now_s, ed.now_s + extra_delay_s + duration, replica_id, numa,
        qa.seq, qa.attempt,
    )  # fmt: skip
    lane = lane_of(spec.binding.kind)
    del ed.w(lane)[spec.action_id]
    note_queued(ed, lane, spec.tenant, -1)
    note_deadline(ed, lane, spec, -1)
    note_held(ed, lane, spec.tenant, share_units(lane, grant))
    if spec.binding.kind == "env":
        env_id = spec.binding.name
        ed.w("env_busy")[env_id] = ed.env_busy.get(env_id, ()) + (spec.action_id,)
    if replica_id is not None:
        rep = ed.replicas[replica_id]
        busy = (*rep.busy_actions, spec.action_id)  # several only for a batching service
        ed.w("replicas")[replica_id] = replace(rep, busy_actions=busy, last_used_s=ed.now_s)
    mem_limit = memory.limit_bytes(ed, spec.binding.name) if per_action else None
    return StartAction(
        spec.action_id, node_id, grant, dop, reason, cause, replica_id, numa, attempt=qa.attempt, mem_limit_bytes=mem_limit,
        cpu_limit_millicores=cpu_limit,
    )


def finish_action(ed: StateEditor, action_id: str, exec_s: float | None) -> Running | None:
    """Release everything a running action holds; unknown ids are ignored (idempotent)."""
    run = ed.running.get(action_id)
    if run is None:
        return None
    del ed.w("running")[action_id]
    if action_id in ed.mem_waits:
        del ed.w("mem_waits")[action_id]
    lane = lane_of(run.spec.binding.kind)
    note_held(ed, lane, run.spec.tenant, -share_units(lane, run.grant))
    if run.grant.cpu_millicores or run.grant.mem_bytes:
        ed.give_cpu(run.node_id, run.grant, run.numa_millicores)
    if run.spec.binding.kind == "api" and run.grant.quota_tokens:
        ed.give_quota(run.spec.binding.name, run.grant.quota_tokens)
    if run.spec.binding.kind == "env":
        env_id = run.spec.binding.name
        left = tuple(a for a in ed.env_busy.get(env_id, ()) if a != action_id)
        if left:
            ed.w("env_busy")[env_id] = left
        else:
            ed.w("env_busy").pop(env_id, None)
    rep = ed.replicas.get(run.replica_id) if run.replica_id else None
    if rep is not None and action_id in rep.busy_actions:
        busy = tuple(a for a in rep.busy_actions if a != action_id)
        ed.w("replicas")[rep.replica_id] = replace(rep, busy_actions=busy, last_used_s=ed.now_s)
    if exec_s is not None:
        observe_duration(ed, run, exec_s)
    return run


def requeue(ed: StateEditor, run: Running) -> QueuedAction:
    """Queue a running action again for its next attempt (its node was lost), at the place
    it had: same arrival time (its queue time and aging count from there, so a retry is
    never starved) and same sequence number (lanes stay in sequence order). The caller has
    released what it held (``finish_action``)."""
    lane = lane_of(run.spec.binding.kind)
    qa = QueuedAction(run.spec, run.submitted_s, run.seq, run.attempt + 1)
    table = ed.w(lane)
    later = [(a, q) for a, q in table.items() if q.seq > qa.seq]
    for a, _ in later:  # re-inserted after it: dicts keep insertion order, lanes are FCFS
        del table[a]
    table[run.spec.action_id] = qa
    table.update(later)
    note_queued(ed, lane, run.spec.tenant, +1)
    note_deadline(ed, lane, run.spec, +1)
    return qa


def request_env(ed: StateEditor, spec: EnvSpec) -> None:
    seq = ed.next_seq()
    ed.w("envs")[spec.env_id] = EnvState(spec, ed.now_s, seq)
    ed.w("env_queue")[spec.env_id] = seq


def assign_env(ed: StateEditor, env_id: str, node_id: str, held: ResourceVector) -> None:
    """Give a pending env its node; ``held`` (its memory, plus fixed cores for pod-style
    policies) is taken now. Its sandbox is ordered by ``place_env_order`` (at once, or
    once its image's layers are on the node)."""
    env = ed.envs[env_id]
    numa = ed.take_cpu(node_id, held) if not held.is_zero() else ()
    ed.w("envs")[env_id] = replace(env, node_id=node_id, held=held, held_numa=numa)
    del ed.w("env_queue")[env_id]


def place_env_order(ed: StateEditor, env_id: str, reason: str, cause: str) -> PlaceEnv:
    """The order creating an assigned env's sandbox on its node."""
    env = ed.envs[env_id]
    assert env.node_id is not None
    return PlaceEnv(env_id, env.node_id, env.held, reason, cause, env.held_numa)


def place_env(ed: StateEditor, env_id: str, node_id: str, held: ResourceVector, reason: str, cause: str) -> PlaceEnv:
    """Place a pending env and order its sandbox at once (``assign_env`` + ``place_env_order``)."""
    assign_env(ed, env_id, node_id, held)
    return place_env_order(ed, env_id, reason, cause)


def release_env(ed: StateEditor, env_id: str, reason: str, cause: str) -> ReleaseEnv | None:
    """Free what the env holds and order its sandbox destroyed; None for an unknown env
    (idempotent). An env still pending placement has no sandbox, but the order is still
    given so an executor that raced ahead can clean up."""
    env = ed.envs.get(env_id)
    if env is None:
        return None
    del ed.w("envs")[env_id]
    if env_id in ed.env_queue:
        del ed.w("env_queue")[env_id]
    if env_id in ed.env_pulls:  # its pulls go on: their layers serve later envs
        del ed.w("env_pulls")[env_id]
    if env_id in ed.env_footprint:
        del ed.w("env_footprint")[env_id]
    if env.node_id is not None and not env.held.is_zero():
        ed.give_cpu(env.node_id, env.held, env.held_numa)
    return ReleaseEnv(env_id, env.node_id, reason, cause)


def load_replica(
    ed: StateEditor, service: str, node_id: str, offset: int, size: int, reason: str, cause: str, *, pinned: bool = False
) -> tuple[Replica, LoadService]:
    replica_id = f"{service}@{node_id}:{offset}x{size}#{ed.next_seq()}"
    ed.take_devices(node_id, offset, size)
    rep = Replica(replica_id, service, node_id, offset, size, last_used_s=ed.now_s, pinned=pinned)
    ed.w("replicas")[replica_id] = rep
    return rep, LoadService(replica_id, service, node_id, offset, size, reason, cause)


def evict_replica(ed: StateEditor, replica_id: str, reason: str, cause: str) -> EvictService:
    rep = ed.replicas[replica_id]
    del ed.w("replicas")[replica_id]
    ed.give_devices(rep.node_id, rep.offset, rep.size)
    return EvictService(replica_id, reason, cause)


def reject(ed: StateEditor, action_id: str, reason: str, cause: str, outcome: str = "rejected") -> RejectAction:
    """End a queued (or never queued) action with ``outcome`` without running it."""
    qa = ed.find_queued(action_id)
    if qa is not None:
        lane = lane_of(qa.spec.binding.kind)
        del ed.w(lane)[action_id]
        note_queued(ed, lane, qa.spec.tenant, -1)
        note_deadline(ed, lane, qa.spec, -1)
    return RejectAction(action_id, reason, cause, outcome)


def drop_replica(ed: StateEditor, replica_id: str) -> Replica | None:
    """Forget a replica that failed or was lost (no decision: it is already gone)."""
    rep = ed.replicas.get(replica_id)
    if rep is None:
        return None
    del ed.w("replicas")[replica_id]
    ed.give_devices(rep.node_id, rep.offset, rep.size)
    return rep


__all__ = [
    "assign_env",
    "drop_replica",
    "estimated_t_ori",
    "evict_replica",
    "finish_action",
    "load_replica",
    "place_env",
    "place_env_order",
    "reject",
    "release_env",
    "request_env",
    "requeue",
    "start_action",
]
