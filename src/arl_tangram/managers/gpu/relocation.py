"""Shell: reserve an extent for a load, sliding idle replicas down when space is fragmented.

The mechanism that keeps the core's byte accounting of a device true: when the core says a
replica fits (enough free bytes), it fits. One move at a time (``compaction.next_move``):
- under the manager lock: pick the lowest movable extent with a hole below it, mark its
  replica ``MOVING`` (new runs wait) and extend its extent down over the hole, so no other
  load can be placed into bytes the move still reads;
- without the lock: wait for the replica's in-flight runs to finish, copy the bytes down;
- under the lock: trim the extent to its new place, re-point the replica, ``RESIDENT``.
A move whose copy raises drops that replica (bytes may be half-moved); the core hears of it
through the replica's ``failed`` state. Nothing is ever evicted to make room.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.compaction import Move, next_move
from arl_tangram.managers.gpu.errors import (
    CallCancelledError,
    DeviceBusyError,
    InsufficientDeviceMemoryError,
)
from arl_tangram.managers.gpu.extents import Extent

if TYPE_CHECKING:
    from arl_tangram.managers.gpu.replica import Replica


def movable_on(replicas: Mapping[str, Replica], device: int) -> dict[int, tuple[Replica, int]]:
    """Extent offset -> (replica, shard) of the resident replicas on ``device`` (lock held):
    what compaction may move now."""
    from arl_tangram.managers.gpu.replica import ReplicaState

    found: dict[int, tuple[Replica, int]] = {}
    for replica in replicas.values():
        if replica.state is ReplicaState.RESIDENT:
            for shard, (d, extent) in enumerate(zip(replica.devices, replica.extents, strict=True)):
                if d == device and extent is not None:
                    found[extent.offset_bytes] = (replica, shard)
    return found


class Relocator:
    """Reservations and moves on the arenas; shares the manager's replica table, lock and
    closed flag (the table is read only with the lock held)."""

    def __init__(
        self,
        arenas: list[DeviceArena],
        replicas: Mapping[str, Replica],
        lock: threading.Condition,
        closed: threading.Event,
        wait_timeout_s: float,
    ) -> None:
        self._arenas = arenas
        self._replicas = replicas
        self._lock = lock
        self._closed = closed
        self._wait_timeout_s = wait_timeout_s

    def reserve(self, replica: Replica, device: int, nbytes: int, deadline: float) -> Extent:
        """An extent of ``nbytes`` on ``device`` for ``replica``, compacting as needed."""
        arena = self._arenas[device]
        while True:
            with self._lock:
                self._check_open(replica)
                extent = arena.extents.allocate(nbytes)
                if extent is not None:
                    return extent
                need = arena.extents.size_for(nbytes)
                if arena.extents.free_bytes < need:
                    raise InsufficientDeviceMemoryError(
                        arena.spec.device_id, need, arena.extents.free_bytes, replica.replica_id
                    )
                planned = self._begin_move(device)
                if planned is None:  # only extents that cannot move now: loads still copying
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeviceBusyError(
                            f"replica {replica.replica_id!r}: {need} bytes free on {arena.spec.device_id} "
                            "but fragmented by loads in progress until the timeout"
                        )
                    self._lock.wait(min(remaining, 0.5))
                    continue
            self._finish_move(device, *planned, deadline)

    def compact(self, device: int, deadline: float) -> int:
        """Slide every movable extent of ``device`` down; returns the bytes moved."""
        moved = 0
        while True:
            with self._lock:
                if self._closed.is_set():
                    raise CallCancelledError("the GPU manager closed during compaction")
                planned = self._begin_move(device)
            if planned is None:
                return moved
            self._finish_move(device, *planned, deadline)
            moved += planned[2].source.size_bytes

    def _check_open(self, replica: Replica) -> None:
        if self._closed.is_set():
            raise CallCancelledError(
                f"replica {replica.replica_id!r}: the GPU manager closed during load"
            )

    def _begin_move(self, device: int) -> tuple[Replica, int, Move] | None:
        """Reserve the next move (lock held): the owner goes MOVING, its extent covers the hole."""
        from arl_tangram.managers.gpu.replica import ReplicaState

        owners = movable_on(self._replicas, device)
        move = next_move(self._arenas[device].extents, owners)
        if move is None:
            return None
        owner, shard = owners[move.source.offset_bytes]
        with owner.cond:
            owner.transition(ReplicaState.MOVING)
        self._arenas[device].extents.extend_down(move.source.offset_bytes, move.target_offset_bytes)
        return owner, shard, move

    def _finish_move(
        self, device: int, owner: Replica, shard: int, move: Move, deadline: float
    ) -> None:
        """Drain, copy down without the lock, publish under it."""
        from arl_tangram.managers.gpu.replica import ReplicaState

        arena = self._arenas[device]
        drained = owner.wait_idle(
            max(deadline, time.monotonic() + self._wait_timeout_s), self._closed
        )
        started = time.perf_counter()
        failure: BaseException | None = None
        if drained and not self._closed.is_set():
            try:
                arena.move_down(
                    move.source.offset_bytes, move.target_offset_bytes, move.source.size_bytes
                )
            except BaseException as exc:  # published below: the owner is dropped
                failure = exc
        with self._lock:
            union = Extent(
                move.target_offset_bytes, move.source.end_bytes - move.target_offset_bytes
            )
            with owner.cond:
                if self._closed.is_set():  # close releases whatever the owner holds: the union
                    owner.extents[shard] = union
                elif failure is not None:  # half-moved bytes: drop the replica, free all it holds
                    owner.extents[shard] = union
                    for d, extent in zip(owner.devices, owner.extents, strict=True):
                        if extent is not None:
                            self._arenas[d].extents.free(extent.offset_bytes)
                    owner.extents = [None] * len(owner.extents)
                    owner.error = f"relocation failed: {type(failure).__name__}: {failure}"
                    owner.transition(ReplicaState.FAILED)
                else:
                    keep = move.target if drained else move.source
                    arena.extents.trim(union.offset_bytes, keep)
                    owner.extents[shard] = keep
                    if drained:
                        owner.repoint()
                        arena.num_relocations += 1
                        arena.relocated_bytes += move.source.size_bytes
                        arena.relocation_s += time.perf_counter() - started
                if owner.state is ReplicaState.MOVING:
                    owner.transition(ReplicaState.RESIDENT)
            self._lock.notify_all()
        if failure is not None:
            raise failure
        if self._closed.is_set():
            raise CallCancelledError("the GPU manager closed during compaction")
        if not drained:
            raise DeviceBusyError(
                f"replica {owner.replica_id!r} stayed in use; it could not be moved"
            )
