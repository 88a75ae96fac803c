"""Core-style accounting (no torch): where each tensor of a service lives inside its blocks.

A service's weights are a list of tensors. Its *layout* packs them into a few power-of-two
blocks (what the buddy allocator hands out) so that a service of ``S`` bytes needs about
``S`` bytes of arena, not the next power of two: the blocks start as the binary
decomposition of ``S`` (rounded to the block granule) and tensors go in largest first, best
fit. A tensor that fits nowhere gets an extra block. Every tensor starts at a multiple of
``align_bytes`` so that ``uint8`` views can be reinterpreted as any dtype.

The host backup mirrors the layout byte for byte (blocks back to back), so a swap-in is one
large copy per block, not one small copy per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from arl_tangram.managers.gpu.buddy import binary_decomposition, round_up

DEFAULT_ALIGN_BYTES = 256


@dataclass(frozen=True)
class Slot:
    """Tensor ``index`` lives at ``offset_bytes`` inside block ``block``."""

    index: int
    block: int
    offset_bytes: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """Blocks (sizes, in host order) and one slot per tensor."""

    block_sizes_bytes: tuple[int, ...]
    slots: tuple[Slot, ...]
    payload_bytes: int  # sum of tensor sizes, before alignment and rounding

    @property
    def total_bytes(self) -> int:
        return sum(self.block_sizes_bytes)

    def host_offset_bytes(self, block: int) -> int:
        return sum(self.block_sizes_bytes[:block])


def _pow2_at_least(size_bytes: int, unit_bytes: int) -> int:
    units = max(1, -(-size_bytes // unit_bytes))
    return unit_bytes << (units - 1).bit_length()


def _pack(
    sizes: Sequence[int], order: Sequence[int], blocks: list[int], used: list[int]
) -> tuple[list[tuple[int, int]], list[int]]:
    """Best-fit-decreasing of tensors ``order`` into ``blocks``.

    Returns ``(placements as (tensor, block), unplaced tensors)`` and updates ``used``.
    """
    unplaced: list[int] = []
    placements: list[tuple[int, int]] = []
    for index in order:
        candidates = [b for b in range(len(blocks)) if blocks[b] - used[b] >= sizes[index]]
        if not candidates:
            unplaced.append(index)
            continue
        best = min(candidates, key=lambda b: (blocks[b] - used[b], b))
        placements.append((index, best))
        used[best] += sizes[index]
    return placements, unplaced


def plan_layout(
    tensor_nbytes: Sequence[int],
    min_block_bytes: int,
    align_bytes: int = DEFAULT_ALIGN_BYTES,
    num_tries: int = 32,
) -> Layout:
    """Pack tensors of the given sizes into power-of-two blocks of at least ``min_block_bytes``.

    Tensors are indivisible, so a packing into the binary decomposition of the exact total
    usually leaves a few tensors over. Starting totals one granule apart decompose into
    different block sets, so ``num_tries`` of them are packed and the smallest result kept
    (ties: fewer blocks, then the earlier try). Deterministic.
    """
    sizes = [round_up(max(n, 1), align_bytes) for n in tensor_nbytes]
    total = round_up(max(sum(sizes), 1), min_block_bytes)
    best: tuple[int, int, list[int], dict[int, int]] | None = None
    for attempt in range(num_tries):
        blocks, slots = _pack_from(sizes, total + attempt * min_block_bytes, min_block_bytes)
        used_blocks = sorted(set(slots.values()))
        size = sum(blocks[b] for b in used_blocks)
        if best is None or (size, len(used_blocks)) < (best[0], best[1]):
            best = (size, len(used_blocks), blocks, slots)
        if size == total:
            break
    assert best is not None
    return _assign_offsets(tensor_nbytes, sizes, best[2], best[3])


def _pack_from(
    sizes: list[int], start_total: int, min_block_bytes: int
) -> tuple[list[int], dict[int, int]]:
    blocks = binary_decomposition(start_total, min_block_bytes)
    used = [0] * len(blocks)
    slots: dict[int, int] = {}
    pending = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    while pending:
        placements, pending = _pack(sizes, pending, blocks, used)
        slots.update(placements)
        if pending:  # spill: a block big enough for the largest leftover, plus the rest
            spill = round_up(sum(sizes[i] for i in pending), min_block_bytes)
            largest = _pow2_at_least(sizes[pending[0]], min_block_bytes)
            extra = [largest] + binary_decomposition(max(spill - largest, 0), min_block_bytes)
            blocks.extend(extra)
            used.extend([0] * len(extra))
    return blocks, slots


def _assign_offsets(
    tensor_nbytes: Sequence[int], sizes: list[int], blocks: list[int], slots: dict[int, int]
) -> Layout:
    fill = [0] * len(blocks)
    placed: list[Slot] = []
    for index in range(len(sizes)):
        block = slots[index]
        placed.append(Slot(index, block, fill[block], tensor_nbytes[index]))
        fill[block] += sizes[index]
    keep = [b for b in range(len(blocks)) if fill[b] > 0] or [0]
    renumber = {old: new for new, old in enumerate(keep)}
    final = tuple(Slot(s.index, renumber[s.block], s.offset_bytes, s.nbytes) for s in placed)
    return Layout(tuple(blocks[b] for b in keep), final, sum(tensor_nbytes))


def split_balanced(tensor_nbytes: Sequence[int], num_parts: int) -> list[list[int]]:
    """Split tensor indices, in order, into ``num_parts`` contiguous groups of similar bytes.

    Used to shard a multi-device service: consecutive tensors (roughly consecutive layers)
    stay together. Greedy against the running target; every part gets at least one tensor
    when there are enough tensors.
    """
    total = sum(tensor_nbytes)
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    part, acc = 0, 0
    for index, nbytes in enumerate(tensor_nbytes):
        remaining_tensors = len(tensor_nbytes) - index
        must_advance = remaining_tensors <= num_parts - 1 - part and parts[part]
        target = total * (part + 1) / num_parts
        if part < num_parts - 1 and parts[part] and (acc + nbytes / 2 > target or must_advance):
            part += 1
        parts[part].append(index)
        acc += nbytes
    return parts
