"""Core: GPU service actions: Evict-on-Execution (pooled) and static dedicated deployments.

Pooled: a service action runs on an idle resident replica of its service; else the policy
weighs waiting for a busy replica against restoring a new replica from host memory
(swap-in) onto a free aligned chunk, evicting least-recently-used idle replicas to make
one. Static (the SGLang-style baseline): each service owns fixed replicas placed at
bootstrap; its actions queue for them and nothing is shared.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping

from arl_tangram.core import ledger
from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.chunks import best_chunk, chunk_mask
from arl_tangram.core.decisions import Decision
from arl_tangram.core.fair_share import share_order
from arl_tangram.core.state import QueuedAction, Replica, StateEditor


def swap_in_s(service: ServiceSpec, size: int, host_to_device_gbps: float) -> float:
    """Restore time: each of ``size`` devices copies its shard in parallel at the link bandwidth."""
    return service.weight_bytes / size / (host_to_device_gbps * 1e9)


def _bounds(ed: StateEditor, qa: QueuedAction) -> tuple[int, int]:
    svc = ed.spec.services[qa.spec.binding.name]
    return max(qa.spec.dop_min, svc.devices_min), min(qa.spec.dop_max, svc.devices_max)


def _idle_replica(ed: StateEditor, service: str, lo: int, hi: int) -> Replica | None:
    """A resident replica of ``service`` with room: idle, or (a generating service) running
    fewer than ``max_batch`` actions, whose batch a new one joins at a decode step. Prefers
    ready, then less busy, then wide, then recently used replicas."""
    room = ed.spec.services[service].max_batch
    idle = [r for r in ed.replicas.values() if r.service == service and len(r.busy_actions) < room and lo <= r.size <= hi]
    if not idle:
        return None
    return max(idle, key=lambda r: (r.ready, -len(r.busy_actions), r.size, r.last_used_s, r.replica_id))


def _evictable_block(ed: StateEditor, size: int) -> tuple[str, int, list[Replica]] | None:
    """An aligned block of ``size`` freed by evicting only idle, unpinned replicas.

    Prefers the block that evicts the fewest devices, then the replicas whose service has
    the least recent demand per resident replica (plain LRU would evict a hot teacher that
    happens to be idle for a moment to serve a cold one, then restore it again), then the
    least recently used. A larger replica spanning the block may be evicted whole.
    """
    resident = collections.Counter(r.service for r in ed.replicas.values())
    worth = {s: ledger.service_demand(ed, s) / n for s, n in resident.items()}
    best: tuple[tuple[int, float, float], str, int, list[Replica]] | None = None
    for node in ed.spec.gpu_nodes:
        if node.node_id not in ed.gpu or size > node.devices:
            continue
        on_node = [r for r in ed.replicas.values() if r.node_id == node.node_id]
        for offset in range(0, node.devices, size):
            mask = chunk_mask(offset, size)
            inside = [r for r in on_node if chunk_mask(r.offset, r.size) & mask]
            if any(r.busy_action is not None or r.pinned for r in inside):
                continue
            key = (
                sum(r.size for r in inside),
                sum(worth[r.service] for r in inside),
                max((r.last_used_s for r in inside), default=0.0),
            )
            if best is None or key < best[0]:
                best = (key, node.node_id, offset, inside)
    return None if best is None else best[1:]


def _free_chunk(ed: StateEditor, size: int) -> tuple[str, int] | None:
    for node in ed.spec.gpu_nodes:
        used = ed.gpu.get(node.node_id)
        if used is None:
            continue
        offset = best_chunk(used, size, node.devices)
        if offset is not None:
            return node.node_id, offset
    return None


def schedule_pooled(ed: StateEditor, cause: str, depth: int, host_to_device_gbps: float) -> list[Decision]:
    """Start queued service actions FCFS (up to ``depth`` looked at) under Evict-on-Execution."""
    decisions: list[Decision] = []
    projected: dict[str, list[float]] = {}  # service -> projected free times of its busy replicas
    no_room: set[int] = set()  # chunk sizes found impossible this round (allocations only shrink room)
    share = _fair_share(ed)
    backlog = collections.Counter(qa.spec.binding.name for qa in ed.queue_service.values())
    for qa in list(itertools.islice(share_order(ed, "queue_service"), depth)):
        name = qa.spec.binding.name
        lo, hi = _bounds(ed, qa)
        rep = _idle_replica(ed, name, lo, hi)
        if rep is not None and _should_reshard(rep, share, lo, backlog[name]):
            # A wide idle replica under a deep backlog: narrower replicas on the same devices
            # serve more requests per second (parallel efficiency < 1). Re-restore narrower.
            decisions.append(ledger.evict_replica(ed, rep.replica_id, "EoE: reshard narrower for a backlog", cause))
            no_room.clear()
            rep = None
        backlog[name] -= 1
        if rep is not None:
            decisions.append(ledger.start_action(ed, qa, rep.node_id, rep.size, "EoE: resident replica", cause, replica_id=rep.replica_id))
            continue
        if all(s in no_room for s in (1, 2, 4, 8) if lo <= s <= hi):
            continue
        frees = projected.setdefault(name, sorted(
            r.expected_end_s for r in ed.running.values() if r.replica_id and ed.replicas[r.replica_id].service == name
        ))
        if not _restore(ed, qa, frees, no_room, share, host_to_device_gbps, cause, decisions) and frees:
            frees.pop(0)  # this action is projected onto the earliest busy replica
    return decisions


def _worth_stealing(ed: StateEditor, service: str, victims: list[Replica]) -> bool:
    """True if one more replica of ``service`` is worth more than the replicas it would evict.

    Worth is recent demand per resident replica. Without this, a service that merely has to
    wait a little grabs the replicas of a hotter one, which must then be restored again.
    """
    resident = collections.Counter(r.service for r in ed.replicas.values())
    mine = ledger.service_demand(ed, service) / (resident[service] + 1)
    theirs = sum(ledger.service_demand(ed, v.service) / resident[v.service] for v in victims)
    return mine > theirs


def _should_reshard(rep: Replica, share: int, lo: int, waiting: int) -> bool:
    """True if ``rep`` is wider than the fair share and the backlog would fill its devices
    with narrower replicas (so no device sits idle after the split)."""
    return not rep.pinned and rep.ready and not rep.busy_actions and lo <= share < rep.size and waiting >= rep.size // share


def _restore(
    ed: StateEditor,
    qa: QueuedAction,
    frees: list[float],
    no_room: set[int],
    share: int,
    host_to_device_gbps: float,
    cause: str,
    decisions: list[Decision],
) -> bool:
    """Restore a new replica for ``qa`` if that beats waiting for a busy one; True if started.

    Tries chunk sizes from ``min(hi, share)`` down: with a backlog, small replicas serve
    more requests per device (parallel efficiency < 1), and with none, the largest size
    gives the lowest latency. A size needs a free aligned chunk or one made by evicting
    least-recently-used idle replicas.
    """
    name = qa.spec.binding.name
    svc = ed.spec.services[name]
    lo, hi = _bounds(ed, qa)
    t_ori = ledger.estimated_t_ori(ed, qa)
    wait_s = (frees[0] - ed.now_s + qa.spec.duration_s(t_ori, lo)) if frees else float("inf")
    sizes = {s for s in (1, 2, 4, 8) if lo <= s <= min(hi, max(lo, share))} - no_room
    for size in sorted(sizes, reverse=True):
        load_s = swap_in_s(svc, size, host_to_device_gbps)
        if load_s + qa.spec.duration_s(t_ori, size) >= wait_s:
            continue  # a busy replica frees sooner than a new one could be restored
        spot = _free_chunk(ed, size)
        if spot is None:
            block = _evictable_block(ed, size)
            if block is None:
                no_room.add(size)
                continue
            node_id, offset, victims = block
            if frees and not _worth_stealing(ed, name, victims):
                continue  # it can wait for its own busy replica rather than evict a hotter service
            decisions.extend(ledger.evict_replica(ed, v.replica_id, "EoE: LRU idle, space needed", cause) for v in victims)
            spot = (node_id, offset)
        new, load = ledger.load_replica(ed, name, spot[0], spot[1], size, "EoE: swap in from host memory", cause)
        decisions.append(load)
        decisions.append(ledger.start_action(ed, qa, new.node_id, size, "EoE: on a restored replica", cause, replica_id=new.replica_id, extra_delay_s=load_s))
        return True
    return False


ACTIVE_DEMAND = 0.5  # decayed requests above which a service counts as in use


def _fair_share(ed: StateEditor) -> int:
    """Devices a restore may take: the free and evictable devices split evenly over the
    waiting service actions, and no more than the pool split over the services in use.

    The second bound keeps one busy service from restoring wide replicas that the other
    services' next requests would only evict again.
    """
    available = sum(node.devices - bin(ed.gpu.get(node.node_id, 0)).count("1") for node in ed.spec.gpu_nodes)
    available += sum(r.size for r in ed.replicas.values() if r.busy_action is None and not r.pinned)
    total = sum(node.devices for node in ed.spec.gpu_nodes if node.node_id in ed.gpu)
    active = sum(1 for s in ed.service_demand if ledger.service_demand(ed, s) >= ACTIVE_DEMAND)
    share = max(1, min(available // max(1, len(ed.queue_service)), total // max(1, active)))
    return 1 << (share.bit_length() - 1)


def bootstrap_static(ed: StateEditor, deployments: Mapping[str, tuple[int, int]]) -> list[Decision]:
    """Place ``count`` pinned replicas of ``size`` devices per service, in name order."""
    decisions: list[Decision] = []
    for name in sorted(deployments):
        count, size = deployments[name]
        for _ in range(count):
            spot = _free_chunk(ed, size)
            if spot is None:
                raise ValueError(f"static deployment of {name}: no free aligned chunk of {size} devices left")
            rep, load = ledger.load_replica(ed, name, spot[0], spot[1], size, "static deployment", "bootstrap", pinned=True)
            decisions.append(load)
    return decisions


def schedule_static(ed: StateEditor, cause: str, depth: int) -> list[Decision]:
    """FCFS per service onto its own idle pinned replicas; nothing is borrowed across services."""
    decisions: list[Decision] = []
    for qa in list(itertools.islice(ed.queue_service.values(), depth)):
        rep = _idle_replica(ed, qa.spec.binding.name, 1, 8)
        if rep is not None and rep.ready:
            # The deployment's size is the operator's; the action is accounted at the
            # nearest DoP it allows (submission already checked the ranges overlap).
            dop = min(max(rep.size, qa.spec.dop_min), qa.spec.dop_max)
            decisions.append(ledger.start_action(ed, qa, rep.node_id, dop, "static: dedicated replica", cause, replica_id=rep.replica_id))
    return decisions
