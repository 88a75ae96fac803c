"""Core-style accounting (no torch, no I/O): sliding compaction plans for one arena.

Resident weights are read-only, so an idle replica's extent can be *moved down* into the
hole just below it: an on-device copy instead of an eviction and a later host -> device
swap-in. Sliding every movable extent down, lowest first, gathers the free bytes into one
hole at the top (holes survive only below extents that cannot move: a load still copying).

``next_move`` picks one move at a time so the manager can reserve it under its lock, copy
outside it and publish, and stop as soon as the wanted extent fits.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from arl_tangram.managers.gpu.extents import Extent, ExtentModel


@dataclass(frozen=True)
class Move:
    """Slide ``source`` down to ``target_offset_bytes`` (the start of the hole below it)."""

    source: Extent
    target_offset_bytes: int

    @property
    def target(self) -> Extent:
        return Extent(self.target_offset_bytes, self.source.size_bytes)


def next_move(allocator: ExtentModel, movable: Container[int]) -> Move | None:
    """The lowest movable extent with a hole directly below it, or ``None``.

    ``movable`` holds the offsets of extents that may move now.
    """
    position = 0
    for extent in allocator.used_extents():
        if extent.offset_bytes > position and extent.offset_bytes in movable:
            return Move(extent, position)
        position = extent.end_bytes
    return None


def fits_after_compaction(allocator: ExtentModel, movable: Container[int], nbytes: int) -> bool:
    """Whether ``nbytes`` would fit once every movable extent slid down (a dry run)."""
    twin = allocator.clone()
    moved: set[int] = set()
    while twin.allocate(nbytes) is None:
        move = next_move(twin, {o for o in _offsets(twin) if o in movable or o in moved})
        if move is None:
            return False
        apply_move(twin, move)
        moved.add(move.target_offset_bytes)
    return True


def apply_move(allocator: ExtentModel, move: Move) -> None:
    """Accounting of a whole move at once (dry runs; the manager reserves and trims)."""
    allocator.extend_down(move.source.offset_bytes, move.target_offset_bytes)
    allocator.trim(move.target_offset_bytes, move.target)


def _offsets(allocator: ExtentModel) -> list[int]:
    return [e.offset_bytes for e in allocator.used_extents()]
