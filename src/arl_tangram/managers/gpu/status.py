"""Shell: typed, JSON-able snapshots of devices and services for ``GpuManager.status``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.residency import Residency
from arl_tangram.managers.gpu.service import ModelService


@dataclass(frozen=True)
class DeviceStatus:
    device_id: str
    kind: str
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    largest_free_block_bytes: int
    resident: list[str]
    num_relocations: int
    relocated_bytes: int
    relocation_s: float


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    kind: str
    state: str
    error: str | None
    num_devices: int
    payload_bytes: int
    footprint_bytes: int
    resident_on: list[str]
    in_use: int
    num_requests: int
    num_swap_ins: int
    num_evictions: int
    last_swap_in_s: float


def device_status(index: int, arena: DeviceArena, services: Iterable[ModelService]) -> DeviceStatus:
    allocator = arena.allocator
    resident = sorted(
        s.name for s in services if any(device == index for device, _ in (s.placement or []))
    )
    return DeviceStatus(
        device_id=arena.spec.device_id,
        kind=arena.spec.kind,
        capacity_bytes=allocator.capacity_bytes,
        used_bytes=allocator.used_bytes,
        free_bytes=allocator.free_bytes,
        largest_free_block_bytes=allocator.largest_free_block_bytes(),
        resident=resident,
        num_relocations=arena.num_relocations,
        relocated_bytes=arena.relocated_bytes,
        relocation_s=arena.relocation_s,
    )


def service_status(service: ModelService, residency: Residency) -> ServiceStatus:
    return ServiceStatus(
        name=service.name,
        kind=service.kind,
        state=service.state.value,
        error=service.error,
        num_devices=service.num_devices,
        payload_bytes=service.payload_bytes,
        footprint_bytes=service.footprint_bytes,
        resident_on=[residency.arenas[d].spec.device_id for d, _ in (service.placement or [])],
        in_use=service.in_use,
        num_requests=service.num_requests,
        num_swap_ins=service.num_swap_ins,
        num_evictions=service.num_evictions,
        last_swap_in_s=service.last_swap_in_s,
    )
