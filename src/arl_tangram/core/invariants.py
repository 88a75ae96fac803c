"""Core: ``validate(state)``, the capacity and bookkeeping invariants every state must hold.

Called in tests (and in the simulator's checked mode) after every step. Raises
``InvariantError`` naming the broken rule.
"""

from __future__ import annotations

from collections import defaultdict

from arl_tangram.core.chunks import chunk_mask
from arl_tangram.core.errors import InvariantError
from arl_tangram.core.fair_share import share_units
from arl_tangram.core.resources import MILLICORES_PER_CORE, ZERO, ResourceVector
from arl_tangram.core.state import ClusterState, lane_of


def _fail(rule: str) -> None:
    raise InvariantError(rule)


def _check_cpu(state: ClusterState) -> None:
    used: dict[str, ResourceVector] = defaultdict(lambda: ZERO)
    for run in state.running.values():
        if run.grant.cpu_millicores or run.grant.mem_bytes:
            used[run.node_id] = used[run.node_id] + run.grant
    for env in state.envs.values():
        if env.node_id is not None:
            used[env.node_id] = used[env.node_id] + env.held
    for node in state.spec.cpu_nodes:
        free = state.cpu.get(node.node_id)
        if free is None:
            continue
        u = used[node.node_id]
        if free.free_millicores != node.millicores - u.cpu_millicores:
            _fail(f"cpu {node.node_id}: free millicores {free.free_millicores} != capacity - used {node.millicores - u.cpu_millicores}")
        if free.free_millicores < 0 or free.free_mem_bytes < 0:
            _fail(f"cpu {node.node_id}: over-allocated ({free})")
        if free.free_mem_bytes != node.mem_bytes - u.mem_bytes:
            _fail(f"cpu {node.node_id}: free memory != capacity - used")
        if sum(free.numa_free) != free.free_millicores:
            _fail(f"cpu {node.node_id}: NUMA free {free.numa_free} does not sum to {free.free_millicores}")
        for d, f in enumerate(free.numa_free):
            if not 0 <= f <= node.numa_cores[d] * MILLICORES_PER_CORE:
                _fail(f"cpu {node.node_id}: NUMA domain {d} free {f} out of range")


def _check_gpu(state: ClusterState) -> None:
    masks: dict[str, int] = defaultdict(int)
    for rep in state.replicas.values():
        m = chunk_mask(rep.offset, rep.size)
        if rep.offset % rep.size:
            _fail(f"replica {rep.replica_id}: chunk not aligned")
        if masks[rep.node_id] & m:
            _fail(f"replica {rep.replica_id}: overlaps another replica's devices")
        masks[rep.node_id] |= m
        if any(a not in state.running for a in rep.busy_actions):
            _fail(f"replica {rep.replica_id}: busy with an action that is not running")
        service = state.spec.services.get(rep.service)
        if service is not None and len(rep.busy_actions) > service.max_batch:
            _fail(f"replica {rep.replica_id}: {len(rep.busy_actions)} actions, above max_batch {service.max_batch}")
    for node in state.spec.gpu_nodes:
        if node.node_id in state.gpu and state.gpu[node.node_id] != masks[node.node_id]:
            _fail(f"gpu {node.node_id}: used mask != union of replica chunks")
        if state.gpu.get(node.node_id, 0) >> node.devices:
            _fail(f"gpu {node.node_id}: device outside the node in use")


def _check_quota(state: ClusterState) -> None:
    used: dict[str, int] = defaultdict(int)
    for run in state.running.values():
        if run.spec.binding.kind == "api":
            used[run.spec.binding.name] += run.grant.quota_tokens
    for pool in state.spec.quota_pools:
        q = state.quota[pool.provider]
        if q.free_tokens != pool.max_concurrency - used[pool.provider] or q.free_tokens < 0:
            _fail(f"quota {pool.provider}: free tokens {q.free_tokens} inconsistent or negative")


def _check_env_busy(state: ClusterState) -> None:
    for env_id, actions in state.env_busy.items():
        if not actions:
            _fail(f"env {env_id}: empty busy entry")
        for a in actions:
            run = state.running.get(a)
            if run is None or run.spec.binding.name != env_id:
                _fail(f"env {env_id}: busy with {a}, which is not running there")


def _check_actions(state: ClusterState) -> None:
    if set(state.queued()) & set(state.running):
        _fail("an action is both queued and running")
    for run in state.running.values():
        if not run.spec.dop_min <= run.dop <= run.spec.dop_max:
            _fail(f"action {run.spec.action_id}: dop {run.dop} outside [{run.spec.dop_min}, {run.spec.dop_max}]")
        if run.started_s < run.submitted_s:
            _fail(f"action {run.spec.action_id}: started before it was submitted")


def _check_tenant_counts(state: ClusterState) -> None:
    """The fair share's per-tenant counts agree with the queues and the running set."""
    queued: dict[tuple[str, str], int] = defaultdict(int)
    for lane in ("queue_cpu", "queue_service", "queue_api"):
        for qa in getattr(state, lane).values():
            queued[(lane, qa.spec.tenant)] += 1
    if dict(queued) != dict(state.tenant_queued):
        _fail(f"tenant queue counts {dict(state.tenant_queued)} != the queues' {dict(queued)}")
    deadlines = sum(qa.spec.deadline_s is not None for qa in state.queue_cpu.values())
    if deadlines != state.queued_deadlines:
        _fail(f"queued_deadlines {state.queued_deadlines} != the CPU queue's {deadlines} actions with a deadline")
    held: dict[tuple[str, str], int] = defaultdict(int)
    for run in state.running.values():
        lane = lane_of(run.spec.binding.kind)
        held[(lane, run.spec.tenant)] += share_units(lane, run.grant)
    recorded = {k: u.held_units for k, u in state.tenant_held.items() if u.held_units}
    if {k: v for k, v in held.items() if v} != recorded:
        _fail(f"tenant holdings {recorded} != the running set's {dict(held)}")
    for key, use in state.tenant_held.items():
        if not use.held_units and not state.tenant_queued.get(key):
            _fail(f"tenant use {key} kept although it holds and queues nothing")


def _check_pulls(state: ClusterState) -> None:
    """Pulls run within each node's bound; every waiting env is assigned, not yet ready,
    and waits only on pulls that exist on its own node."""
    running: dict[str, int] = defaultdict(int)
    for p in state.pulls.values():
        if p.expected_end_s is not None:
            running[p.node_id] += 1
    for node in state.spec.cpu_nodes:
        if running[node.node_id] > node.max_concurrent_pulls:
            _fail(f"node {node.node_id}: {running[node.node_id]} pulls run, more than its {node.max_concurrent_pulls}")
    for env_id, waits in state.env_pulls.items():
        env = state.envs.get(env_id)
        if env is None or env.node_id is None or env.ready:
            _fail(f"env {env_id}: waits on pulls but is not an assigned env still starting")
        elif not waits:
            _fail(f"env {env_id}: empty pull wait entry")
        for pull_id in waits:
            pull = state.pulls.get(pull_id)
            if pull is None or env is None or pull.node_id != env.node_id:
                _fail(f"env {env_id}: waits on pull {pull_id}, which is not a pull on its node")


def _check_memory(state: ClusterState) -> None:
    """Memory per action (``core.memory``): an env charged per action never has more than
    its limit in footprint + grants; every memory wait is a running action paused for
    memory, waiting for more than it holds."""
    grants: dict[str, int] = defaultdict(int)
    for run in state.running.values():
        if run.spec.binding.kind == "env":
            grants[run.spec.binding.name] += run.grant.mem_bytes
    for env_id, env in state.envs.items():
        if env.per_action_memory and env.held.mem_bytes + grants[env_id] > env.spec.mem_bytes:
            _fail(f"env {env_id}: footprint {env.held.mem_bytes} + grants {grants[env_id]} over its limit {env.spec.mem_bytes}")
    for action_id, want in state.mem_waits.items():
        paused = state.running.get(action_id)
        if paused is None or paused.paused_since_s is None or paused.pause_cause != "memory":
            _fail(f"action {action_id}: waits for memory but is not a running action paused for memory")
        elif want <= paused.grant.mem_bytes:
            _fail(f"action {action_id}: waits for {want} bytes, no more than its grant {paused.grant.mem_bytes}")


def validate(state: ClusterState) -> None:
    """Raise ``InvariantError`` if any capacity or bookkeeping invariant is broken."""
    _check_cpu(state)
    _check_gpu(state)
    _check_quota(state)
    _check_actions(state)
    _check_env_busy(state)
    _check_tenant_counts(state)
    _check_pulls(state)
    _check_memory(state)
