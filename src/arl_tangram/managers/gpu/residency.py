"""Shell: which services are resident where; placement, LRU eviction, swap-in (Evict-on-Execution).

``Residency`` owns the device arenas and the chunk model, and moves services between host
and devices. Every method must be called with the manager's lock held; the copies of a
swap-in run under that lock too, which serialises swap-ins (simple and safe: a service is
never observed half-copied) while forward passes of resident services go on in parallel.

Compaction (``make_room``, ``compact``) relocates blocks of idle resident services inside
their arena (plans from ``compaction.py``). A service in use is never moved: its blocks are
obstacles. If a relocation's copy raises, every service it touched is evicted (its host
backup is intact), so no service is ever left pointing at half-moved bytes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.buddy import Block, BuddyModel
from arl_tangram.managers.gpu.chunks import ChunkModel
from arl_tangram.managers.gpu.compaction import (
    Move,
    apply_moves,
    final_blocks,
    plan_compaction,
    plan_room,
)
from arl_tangram.managers.gpu.devices import DeviceSpec
from arl_tangram.managers.gpu.errors import NeverFitsError
from arl_tangram.managers.gpu.service import ModelService, ServiceState

Placement = list[tuple[int, list[Block]]]


class Residency:
    """Arenas + chunks of one node. Not thread-safe by itself: callers hold the manager lock."""

    def __init__(self, devices: Sequence[DeviceSpec], min_block_bytes: int) -> None:
        self.arenas = [DeviceArena(spec, min_block_bytes) for spec in devices]
        self.chunks = ChunkModel(len(self.arenas))
        self.min_block_bytes = min_block_bytes
        self._seq = 0

    def touch(self, service: ModelService) -> None:
        """Mark a use; LRU order is by this sequence number (deterministic, no clock)."""
        self._seq += 1
        service.last_used_seq = self._seq

    def check_fits_ever(self, service: ModelService) -> None:
        """Raise ``NeverFitsError`` unless some chunk could hold the service on empty devices."""
        size = service.num_devices
        if size not in self.chunks.level_sizes:
            raise NeverFitsError(
                f"service {service.name!r} needs {size} devices; this node offers chunks of "
                f"{list(self.chunks.level_sizes)} devices"
            )
        for start in self.chunks.chunk_starts(size):
            if all(
                BuddyModel(
                    self.arenas[start + i].allocator.capacity_bytes, self.min_block_bytes
                ).allocate_all(shard.layout.block_sizes_bytes)
                is not None
                for i, shard in enumerate(service.shards)
            ):
                return
        largest = max(a.allocator.capacity_bytes for a in self.arenas)
        raise NeverFitsError(
            f"service {service.name!r} needs {service.footprint_bytes} bytes over {size} device(s) "
            f"(shards {[s.layout.total_bytes for s in service.shards]}); the largest device arena "
            f"holds {largest} bytes"
        )

    def try_place(self, service: ModelService) -> Placement | None:
        """Allocate blocks for every shard on the best chunk that has room now, else ``None``."""
        size = service.num_devices
        for start in self.chunks.ranked_chunks(size):
            placement: Placement = []
            for i, shard in enumerate(service.shards):
                blocks = self.arenas[start + i].allocator.allocate_all(
                    shard.layout.block_sizes_bytes
                )
                if blocks is None:
                    break
                placement.append((start + i, blocks))
            if len(placement) == len(service.shards):
                self.chunks.occupy([device for device, _ in placement])
                return placement
            self._free(placement)
        return None

    def swap_in(self, service: ModelService, placement: Placement) -> None:
        """Copy host -> arena into ``placement``; on failure the blocks are returned."""
        service.transition(ServiceState.SWAPPING_IN)
        started = time.perf_counter()
        try:
            service.copy_in(self.arenas, placement)
        except BaseException:
            service.point_at_host()
            self._release(placement)
            service.transition(ServiceState.HOST)
            raise
        service.last_swap_in_s = time.perf_counter() - started
        service.num_swap_ins += 1
        service.transition(ServiceState.RESIDENT)

    def evict(self, service: ModelService) -> None:
        """Release a resident, unpinned service's blocks (no copy: weights are read-only)."""
        if service.in_use:
            raise RuntimeError(f"service {service.name!r} is in use and cannot be evicted")
        placement = service.point_at_host()
        self._release(placement)
        service.num_evictions += 1
        service.transition(ServiceState.HOST)

    def pick_victim(
        self, service: ModelService, resident: Sequence[ModelService]
    ) -> ModelService | None:
        """Least recently used unpinned resident service on a device the request could use."""
        size = service.num_devices
        usable = {d for start in self.chunks.chunk_starts(size) for d in range(start, start + size)}
        candidates = [
            other
            for other in resident
            if other is not service
            and other.in_use == 0
            and other.placement is not None
            and any(device in usable for device, _ in other.placement)
        ]
        return min(candidates, key=lambda s: s.last_used_seq, default=None)

    def make_room(self, service: ModelService, resident: Sequence[ModelService]) -> bool:
        """Relocate idle blocks (fewest moves of the plan) so ``service`` fits; whether it did.

        Tries chunks in ``try_place``'s order and relocates on the first whose every device
        can be made to fit its shard; moves nothing and returns ``False`` when none can.
        """
        for start in self.chunks.ranked_chunks(service.num_devices):
            plans: list[tuple[int, dict[str, list[Block]], list[Move]]] = []
            for i, shard in enumerate(service.shards):
                movable = self._movable(start + i, resident, service)
                allocator = self.arenas[start + i].allocator.clone()
                moves = plan_room(allocator, movable, shard.layout.block_sizes_bytes)
                if moves is None:
                    break
                plans.append((start + i, movable, moves))
            else:
                for device, movable, moves in plans:
                    self._relocate(device, movable, moves, resident)
                return True
        return False

    def compact(self, devices: Sequence[int], resident: Sequence[ModelService]) -> None:
        """Fully compact ``devices``: idle blocks move down until free space is coalesced."""
        for device in devices:
            movable = self._movable(device, resident, None)
            moves = plan_compaction(self.arenas[device].allocator.clone(), movable)
            self._relocate(device, movable, moves, resident)

    def _movable(
        self, device: int, resident: Sequence[ModelService], exclude: ModelService | None
    ) -> dict[str, list[Block]]:
        """Blocks on ``device`` of resident services that nobody is using (sorted by name)."""
        movable: dict[str, list[Block]] = {}
        for other in sorted(resident, key=lambda s: s.name):
            if other is exclude or other.in_use or other.state is not ServiceState.RESIDENT:
                continue
            for d, blocks in other.placement or []:
                if d == device:
                    movable[other.name] = list(blocks)
        return movable

    def _relocate(
        self,
        device: int,
        movable: dict[str, list[Block]],
        moves: list[Move],
        resident: Sequence[ModelService],
    ) -> None:
        """Apply a plan made on a clone: accounting, on-device copies, then re-pointing."""
        if not moves:
            return
        arena = self.arenas[device]
        by_name = {s.name: s for s in resident}
        moved = final_blocks(movable, moves)
        apply_moves(arena.allocator, moves)
        for name, blocks in sorted(moved.items()):
            by_name[name].set_blocks(device, blocks)
        started = time.perf_counter()
        try:
            arena.copy_within(
                [(m.source.offset_bytes, m.target.offset_bytes, m.source.size_bytes) for m in moves]
            )
        except BaseException:
            for name in sorted(moved):  # bytes may be half-moved: fall back to the host backup
                self.evict(by_name[name])
            raise
        for name in sorted(moved):
            by_name[name].repoint(arena, device)
        arena.relocation_s += time.perf_counter() - started
        arena.num_relocations += len(moves)
        arena.relocated_bytes += sum(m.source.size_bytes for m in moves)

    def _free(self, placement: Placement) -> None:
        for device, blocks in placement:
            self.arenas[device].allocator.free_all(blocks)

    def _release(self, placement: Placement) -> None:
        self._free(placement)
        self.chunks.release([device for device, _ in placement])

    def close(self) -> None:
        for arena in self.arenas:
            arena.close()
