"""Core-style accounting (no torch, no I/O): compaction plans for one buddy arena.

Resident weights are read-only, so the block of an idle service can be *relocated*: take a
free block lower in the arena, copy the bytes device -> device, re-point the tensors, free
the old block. That is far cheaper than evicting a service and swapping it back in later
(an on-device copy instead of a host -> device copy, and no lost residency), so the manager
compacts before it evicts (see ``Residency.make_room``).

This module only decides *which* block goes *where*; the shell (``residency.py``) copies the
bytes and re-points the tensors. Blocks of services that are in use are never passed in as
movable: they are obstacles that compaction works around.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arl_tangram.managers.gpu.buddy import Block, BuddyModel


@dataclass(frozen=True)
class Move:
    """Relocate block ``index`` of ``owner`` (its position in the owner's block list)."""

    owner: str
    index: int
    source: Block
    target: Block


def plan_compaction(allocator: BuddyModel, movable: Mapping[str, Sequence[Block]]) -> list[Move]:
    """Move movable blocks down until none has a free block of its size or larger below it.

    Mutates ``allocator`` (the moves are applied to its accounting); dry-run on
    ``allocator.clone()``. ``movable`` maps an owner to blocks it holds in ``allocator``.

    Ordering contract: each target is allocated while its source is still held, so a move
    never overlaps its own source; a later move's target may overlap an earlier move's
    source, and one block may move more than once, so the copies must run in list order.

    At the fixpoint, if every allocated block was movable, the free blocks inside each root
    have distinct sizes. So with a power-of-two capacity (one root) the largest free block
    is the largest power of two <= ``free_bytes``, and any set of power-of-two blocks
    totalling <= ``free_bytes`` fits (sizes divide each other).
    Deterministic: highest block first (on the churn bench this moves about half the bytes
    of lowest-first for the same result), ties by owner then index. Terminates: every move strictly lowers one block's offset.
    """
    current = {
        (owner, i): block for owner, blocks in movable.items() for i, block in enumerate(blocks)
    }
    moves: list[Move] = []
    changed = True
    while changed:
        changed = False
        for key in sorted(current, key=lambda k: (-current[k].offset_bytes, k)):
            source = current[key]
            target = allocator.allocate_below(source.size_bytes, source.offset_bytes)
            if target is None:
                continue
            allocator.free(source.offset_bytes)
            moves.append(Move(key[0], key[1], source, target))
            current[key] = target
            changed = True
    return moves


def fits_after_compaction(
    allocator: BuddyModel, movable: Mapping[str, Sequence[Block]], sizes_bytes: Sequence[int]
) -> bool:
    """Whether blocks of ``sizes_bytes`` would all fit once the movable blocks are compacted.

    A dry run on a clone: ``allocator`` is not changed.
    """
    twin = allocator.clone()
    plan_compaction(twin, movable)
    return twin.allocate_all(sizes_bytes) is not None


def moved_bytes(moves: Sequence[Move]) -> int:
    return sum(move.source.size_bytes for move in moves)


def final_blocks(
    movable: Mapping[str, Sequence[Block]], moves: Sequence[Move]
) -> dict[str, list[Block]]:
    """Each owner's blocks after ``moves`` (owners without a move are left out)."""
    result: dict[str, list[Block]] = {}
    for move in moves:
        blocks = result.setdefault(move.owner, list(movable[move.owner]))
        blocks[move.index] = move.target
    return result


def plan_room(
    allocator: BuddyModel, movable: Mapping[str, Sequence[Block]], sizes_bytes: Sequence[int]
) -> list[Move] | None:
    """The shortest prefix of the full compaction plan after which ``sizes_bytes`` fit.

    ``None`` when even full compaction does not make room; ``[]`` when they fit already.
    Mutates ``allocator`` like ``plan_compaction`` (only the returned moves are applied).
    """
    full = plan_compaction(allocator.clone(), movable)
    probe = allocator.clone()
    for count in range(len(full) + 1):
        if probe.clone().allocate_all(sizes_bytes) is not None:
            apply_moves(allocator, full[:count])
            return full[:count]
        if count < len(full):
            _apply(probe, full[count])
    return None


def apply_moves(allocator: BuddyModel, moves: Sequence[Move]) -> None:
    """Replay a plan made on a clone of ``allocator`` onto ``allocator`` itself."""
    for move in moves:
        _apply(allocator, move)


def _apply(allocator: BuddyModel, move: Move) -> None:
    target = allocator.allocate_below(move.source.size_bytes, move.source.offset_bytes)
    if target != move.target:
        raise RuntimeError(f"compaction replay diverged: {target} != {move.target}")
    allocator.free(move.source.offset_bytes)
