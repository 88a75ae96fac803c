"""Shell: JSON-able snapshots of devices, services and replicas for ``GpuManager.status``, and
the accounting check behind ``GpuManager.check_invariants``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.extents import Extent
from arl_tangram.managers.gpu.replica import Replica, ReplicaState
from arl_tangram.managers.gpu.service import ModelService

_LIVE = (ReplicaState.LOADING, ReplicaState.RESIDENT, ReplicaState.MOVING, ReplicaState.EVICTING)


def manager_status(
    arenas: Sequence[DeviceArena],
    services: Mapping[str, ModelService],
    replicas: Mapping[str, Replica],
) -> dict[str, Any]:
    """Call with the manager's lock held."""
    live = [r for r in replicas.values() if r.state in _LIVE]
    devices = []
    for index, arena in enumerate(arenas):
        extents = arena.extents
        devices.append(
            {
                "device_id": arena.spec.device_id,
                "kind": arena.spec.kind,
                "capacity_bytes": extents.capacity_bytes,
                "used_bytes": extents.used_bytes,
                "free_bytes": extents.free_bytes,
                "largest_free_extent_bytes": extents.largest_free_extent_bytes(),
                "replicas": sorted(r.replica_id for r in live if index in r.devices),
                "num_relocations": arena.num_relocations,
                "relocated_bytes": arena.relocated_bytes,
                "relocation_s": arena.relocation_s,
                "copy_paused_s": arena.copy_paused_s,
            }
        )
    return {
        "devices": devices,
        "services": {
            name: {
                "handler": s.handler,
                "state": s.info().state,
                "error": s.error,
                "weight_bytes": s.weight_bytes,
                "host_bytes": s.host_layout.total_bytes,
                "host_pinned": s.is_pinned,
                "replicas": sorted(r.replica_id for r in live if r.service is s),
            }
            for name, s in sorted(services.items())
            if s.model is not None or s.error
        },
        "replicas": {
            r.replica_id: {
                "service": r.service.name,
                "state": r.state.value,
                "error": r.error,
                "devices": [arenas[d].spec.device_id for d in r.devices],
                "extent_bytes": [e.size_bytes if e else 0 for e in r.extents],
                "num_in_flight": r.num_in_flight,
                "num_requests": r.num_requests,
                "load_s": r.load_s,
            }
            for r in replicas.values()
        },
    }


def check_extents(arenas: Sequence[DeviceArena], replicas: Iterable[Replica]) -> None:
    """Each open arena's accounting is consistent and equals the bytes its replicas hold.

    Call with the manager's lock held.
    """
    replicas = list(replicas)
    for index, arena in enumerate(arenas):
        if arena.buffer.numel() == 0:
            continue  # closed
        arena.extents.check_invariants()
        held: list[Extent] = [
            extent
            for r in replicas
            for d, extent in zip(r.devices, r.extents, strict=True)
            if d == index and extent is not None
        ]
        assert sum(e.size_bytes for e in held) == arena.extents.used_bytes, (
            f"device {index}: replicas hold {sum(e.size_bytes for e in held)}, "
            f"accounting says {arena.extents.used_bytes}"
        )
