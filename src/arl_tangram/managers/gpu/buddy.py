"""Core-style accounting (no torch, no I/O): a buddy allocator over one device arena.

``BuddyModel`` owns byte offsets only; the arena tensor that the offsets index lives in
``arena.py``. Blocks are power-of-two multiples of ``min_block_bytes`` and aligned to their
own size. A capacity that is not a power of two is covered by *roots*: its binary
decomposition laid out from offset 0, largest first, so every root is aligned to its size and
two buddies never straddle roots.

Placement is best fit then lowest address: a request takes the smallest free block that
holds it, lowest offset first. That keeps used memory packed low and the free memory high and
contiguous, which is what keeps the largest free extent close to the total free after churn.

Not thread-safe: the owner (the manager) serialises calls under its lock.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """A block of the arena: ``[offset_bytes, offset_bytes + size_bytes)``."""

    offset_bytes: int
    size_bytes: int

    @property
    def end_bytes(self) -> int:
        return self.offset_bytes + self.size_bytes


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def binary_decomposition(size_bytes: int, unit_bytes: int) -> list[int]:
    """``size_bytes`` (a multiple of ``unit_bytes``) as distinct power-of-two multiples, largest first."""
    units = size_bytes // unit_bytes
    return [unit_bytes << bit for bit in range(units.bit_length() - 1, -1, -1) if units >> bit & 1]


class BuddyModel:
    """Buddy allocator over ``capacity_bytes`` (rounded down to ``min_block_bytes``)."""

    def __init__(self, capacity_bytes: int, min_block_bytes: int = 64 * 1024) -> None:
        if not is_power_of_two(min_block_bytes):
            raise ValueError(f"min_block_bytes must be a power of two, got {min_block_bytes}")
        self.min_block_bytes = min_block_bytes
        self.capacity_bytes = capacity_bytes // min_block_bytes * min_block_bytes
        if self.capacity_bytes <= 0:
            raise ValueError(
                f"capacity_bytes {capacity_bytes} is smaller than one block of {min_block_bytes}"
            )
        self.roots: tuple[Block, ...] = self._make_roots()
        self.max_order = self._order(self.roots[0].size_bytes)
        # order -> free block offsets; order k holds blocks of min_block_bytes << k.
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._allocated: dict[int, int] = {}  # offset -> order
        self._free_bytes = self.capacity_bytes
        for root in self.roots:
            self._free[self._order(root.size_bytes)].add(root.offset_bytes)

    def _make_roots(self) -> tuple[Block, ...]:
        roots, offset = [], 0
        for size in binary_decomposition(self.capacity_bytes, self.min_block_bytes):
            roots.append(Block(offset, size))
            offset += size
        return tuple(roots)

    def _order(self, size_bytes: int) -> int:
        return (size_bytes // self.min_block_bytes).bit_length() - 1

    def block_size_for(self, size_bytes: int) -> int:
        """The power-of-two block size a request of ``size_bytes`` occupies."""
        units = max(1, -(-size_bytes // self.min_block_bytes))
        return self.min_block_bytes << (units - 1).bit_length()

    # -- queries -------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    @property
    def used_bytes(self) -> int:
        return self.capacity_bytes - self._free_bytes

    def allocated_blocks(self) -> list[Block]:
        return [self._block(off, order) for off, order in sorted(self._allocated.items())]

    def free_blocks(self) -> list[Block]:
        blocks = [self._block(off, k) for k, offs in enumerate(self._free) for off in offs]
        return sorted(blocks, key=lambda b: b.offset_bytes)

    def largest_free_block_bytes(self) -> int:
        for order in range(self.max_order, -1, -1):
            if self._free[order]:
                return self.min_block_bytes << order
        return 0

    def largest_free_extent_bytes(self) -> int:
        """Longest run of adjacent free blocks (a hole), buddies or not."""
        best = run = 0
        end = -1
        for block in self.free_blocks():
            run = run + block.size_bytes if block.offset_bytes == end else block.size_bytes
            end = block.end_bytes
            best = max(best, run)
        return best

    def _block(self, offset: int, order: int) -> Block:
        return Block(offset, self.min_block_bytes << order)

    # -- mutation ------------------------------------------------------------------------
    def allocate(self, size_bytes: int) -> Block | None:
        """Take one block holding ``size_bytes``; ``None`` when no free block is large enough."""
        if size_bytes <= 0:
            raise ValueError(f"size_bytes must be positive, got {size_bytes}")
        order = self._order(self.block_size_for(size_bytes))
        if order > self.max_order:
            return None
        found = next((k for k in range(order, self.max_order + 1) if self._free[k]), None)
        if found is None:
            return None
        return self._take(min(self._free[found]), found, order)

    def allocate_below(self, size_bytes: int, limit_offset_bytes: int) -> Block | None:
        """Like ``allocate`` but only from free blocks of the root holding ``limit_offset_bytes``
        that start below it.

        Compaction's primitive: called with the offset of an allocated block, the result lies
        wholly below that block (free and allocated blocks never overlap). Staying inside the
        root keeps a block that fills a small tail root from splitting a big one. Best fit,
        then lowest address; ``None`` when no such free block is large enough.
        """
        order = self._order(self.block_size_for(size_bytes))
        floor = max(r.offset_bytes for r in self.roots if r.offset_bytes <= limit_offset_bytes)
        for found in range(order, self.max_order + 1):
            below = [off for off in self._free[found] if floor <= off < limit_offset_bytes]
            if below:
                return self._take(min(below), found, order)
        return None

    def _take(self, offset: int, found: int, order: int) -> Block:
        """Remove free block ``(offset, found)``, split it down to ``order``, allocate the lowest part."""
        self._free[found].remove(offset)
        while found > order:  # split, keeping the lower half; the upper half becomes free
            found -= 1
            self._free[found].add(offset + (self.min_block_bytes << found))
        self._allocated[offset] = order
        self._free_bytes -= self.min_block_bytes << order
        return self._block(offset, order)

    def clone(self) -> BuddyModel:
        """An independent copy of the accounting (dry runs: "would compaction make room?")."""
        twin = copy.copy(self)
        twin._free = [set(offsets) for offsets in self._free]
        twin._allocated = dict(self._allocated)
        return twin

    def allocate_all(self, sizes_bytes: Sequence[int]) -> list[Block] | None:
        """Atomically take one block per size (largest first); all or nothing.

        Returns the blocks in the order of ``sizes_bytes``, or ``None`` with nothing taken.
        """
        order = sorted(range(len(sizes_bytes)), key=lambda i: (-sizes_bytes[i], i))
        taken: dict[int, Block] = {}
        for index in order:
            block = self.allocate(sizes_bytes[index])
            if block is None:
                self.free_all(taken.values())
                return None
            taken[index] = block
        return [taken[i] for i in range(len(sizes_bytes))]

    def free(self, offset_bytes: int) -> None:
        """Return a block taken by ``allocate``; merges with free buddies. Double free raises."""
        order = self._allocated.pop(offset_bytes, None)
        if order is None:
            raise ValueError(f"offset {offset_bytes} is not an allocated block")
        self._free_bytes += self.min_block_bytes << order
        offset = offset_bytes
        while order < self.max_order:
            buddy = offset ^ (self.min_block_bytes << order)
            if buddy not in self._free[order]:
                break
            self._free[order].remove(buddy)
            offset = min(offset, buddy)
            order += 1
        self._free[order].add(offset)

    def free_all(self, blocks: Iterable[Block]) -> None:
        for block in blocks:
            self.free(block.offset_bytes)

    # -- invariants ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the accounting is inconsistent (tests call this)."""
        blocks = [(b, "used") for b in self.allocated_blocks()] + [
            (b, "free") for b in self.free_blocks()
        ]
        blocks.sort(key=lambda item: item[0].offset_bytes)
        position = 0
        for block, _ in blocks:
            assert block.offset_bytes % block.size_bytes == 0, f"misaligned {block}"
            assert block.offset_bytes == position, f"gap or overlap at {position}: {block}"
            position = block.end_bytes
        assert position == self.capacity_bytes, "blocks do not tile the capacity"
        free_total = sum(b.size_bytes for b, kind in blocks if kind == "free")
        assert free_total == self._free_bytes, "free byte counter drifted"
        for order, offsets in enumerate(self._free[:-1]):
            for offset in offsets:
                buddy = offset ^ (self.min_block_bytes << order)
                assert buddy not in offsets, f"free buddies {offset} and {buddy} not coalesced"
