"""Core-style accounting (no torch, no I/O): byte extents of one device arena.

``ExtentModel`` owns offsets only; the arena tensor they index lives in ``arena.py``. Every
extent is a multiple of ``granule_bytes`` and starts at one, so a replica's shard of ``S``
bytes takes ``round_up(S, granule)`` bytes: no power-of-two rounding, whatever the size of
its largest tensor. Free space is kept as a sorted, coalesced list of extents, so "the
largest free extent" is exact (adjacent free bytes are one hole by construction).

Placement is best fit, then lowest address: the smallest hole that holds a request, which
keeps large holes whole. Compaction (``compaction.py``) slides extents down; the primitives
it needs are ``extend_down`` (own the gap below an extent for the duration of a move, so no
concurrent load can be placed into bytes still being read) and ``trim`` (keep the moved
part, free the rest).

Not thread-safe: the owner (the manager) serialises calls under its lock.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class Extent:
    """``[offset_bytes, offset_bytes + size_bytes)`` of one arena."""

    offset_bytes: int
    size_bytes: int

    @property
    def end_bytes(self) -> int:
        return self.offset_bytes + self.size_bytes


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class ExtentModel:
    """Extents over ``capacity_bytes`` (rounded down to ``granule_bytes``)."""

    def __init__(self, capacity_bytes: int, granule_bytes: int) -> None:
        if granule_bytes <= 0:
            raise ValueError(f"granule_bytes must be positive, got {granule_bytes}")
        self.granule_bytes = granule_bytes
        self.capacity_bytes = capacity_bytes // granule_bytes * granule_bytes
        if self.capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes {capacity_bytes} is below one granule")
        self._free_starts: list[int] = [0]  # sorted; parallel to _free_sizes
        self._free_sizes: list[int] = [self.capacity_bytes]
        self._used: dict[int, int] = {}  # offset -> size
        self._free_bytes = self.capacity_bytes

    def size_for(self, nbytes: int) -> int:
        """Bytes an extent holding ``nbytes`` takes (rounded up to the granule, at least one)."""
        return round_up(max(nbytes, 1), self.granule_bytes)

    # -- queries -------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    @property
    def used_bytes(self) -> int:
        return self.capacity_bytes - self._free_bytes

    def free_extents(self) -> list[Extent]:
        return [Extent(o, s) for o, s in zip(self._free_starts, self._free_sizes, strict=True)]

    def used_extents(self) -> list[Extent]:
        return [Extent(o, s) for o, s in sorted(self._used.items())]

    def largest_free_extent_bytes(self) -> int:
        return max(self._free_sizes, default=0)

    def is_used(self, offset_bytes: int) -> bool:
        return offset_bytes in self._used

    # -- mutation ------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Extent | None:
        """Take an extent for ``nbytes`` from the smallest hole that holds it (lowest first)."""
        size = self.size_for(nbytes)
        best = None
        for i, hole in enumerate(self._free_sizes):
            if hole >= size and (best is None or hole < self._free_sizes[best]):
                best = i
        if best is None:
            return None
        return self.allocate_at(self._free_starts[best], size)

    def allocate_at(self, offset_bytes: int, nbytes: int) -> Extent:
        """Take exactly ``[offset, offset + size_for(nbytes))``; it must lie inside one hole."""
        size = self.size_for(nbytes)
        if offset_bytes % self.granule_bytes:
            raise ValueError(f"offset {offset_bytes} is not a multiple of {self.granule_bytes}")
        i = bisect.bisect_right(self._free_starts, offset_bytes) - 1
        if i < 0 or offset_bytes + size > self._free_starts[i] + self._free_sizes[i]:
            raise ValueError(f"[{offset_bytes}, {offset_bytes + size}) is not free")
        start, hole = self._free_starts.pop(i), self._free_sizes.pop(i)
        if offset_bytes + size < start + hole:  # the part above stays free
            self._free_starts.insert(i, offset_bytes + size)
            self._free_sizes.insert(i, start + hole - offset_bytes - size)
        if offset_bytes > start:  # the part below stays free
            self._free_starts.insert(i, start)
            self._free_sizes.insert(i, offset_bytes - start)
        self._used[offset_bytes] = size
        self._free_bytes -= size
        return Extent(offset_bytes, size)

    def free(self, offset_bytes: int) -> None:
        """Return an extent taken by ``allocate``/``allocate_at``. Double free raises."""
        size = self._used.pop(offset_bytes, None)
        if size is None:
            raise ValueError(f"offset {offset_bytes} is not an allocated extent")
        self._free_range(offset_bytes, size)

    def extend_down(self, offset_bytes: int, new_offset_bytes: int) -> Extent:
        """Grow the extent at ``offset`` down to ``new_offset`` (the bytes between must be free)."""
        size = self._used[offset_bytes]
        if new_offset_bytes < offset_bytes:
            self.allocate_at(new_offset_bytes, offset_bytes - new_offset_bytes)
            del self._used[offset_bytes]
            self._used[new_offset_bytes] = offset_bytes + size - new_offset_bytes
        return Extent(new_offset_bytes, self._used[new_offset_bytes])

    def trim(self, offset_bytes: int, keep: Extent) -> None:
        """Shrink the extent at ``offset`` to ``keep`` (inside it); the rest becomes free."""
        size = self._used.pop(offset_bytes)
        end = offset_bytes + size
        if keep.offset_bytes < offset_bytes or keep.end_bytes > end or keep.size_bytes <= 0:
            self._used[offset_bytes] = size
            raise ValueError(f"{keep} is not inside [{offset_bytes}, {end})")
        self._used[keep.offset_bytes] = keep.size_bytes
        if keep.offset_bytes > offset_bytes:
            self._free_range(offset_bytes, keep.offset_bytes - offset_bytes)
        if keep.end_bytes < end:
            self._free_range(keep.end_bytes, end - keep.end_bytes)

    def _free_range(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._free_starts, offset)
        start, end = offset, offset + size
        if i < len(self._free_starts) and self._free_starts[i] == end:  # merge with the hole above
            end += self._free_sizes.pop(i)
            self._free_starts.pop(i)
        if i > 0 and self._free_starts[i - 1] + self._free_sizes[i - 1] == start:  # and below
            i -= 1
            start = self._free_starts.pop(i)
            self._free_sizes.pop(i)
        self._free_starts.insert(i, start)
        self._free_sizes.insert(i, end - start)
        self._free_bytes += size

    def clone(self) -> ExtentModel:
        """An independent copy of the accounting (dry runs)."""
        twin = copy.copy(self)
        twin._free_starts = list(self._free_starts)
        twin._free_sizes = list(self._free_sizes)
        twin._used = dict(self._used)
        return twin

    # -- invariants ----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the accounting is inconsistent (tests call this)."""
        spans = [(e, "free") for e in self.free_extents()] + [
            (e, "used") for e in self.used_extents()
        ]
        spans.sort(key=lambda item: item[0].offset_bytes)
        position, previous = 0, ""
        for extent, kind in spans:
            assert extent.offset_bytes == position, f"gap or overlap at {position}: {extent}"
            assert extent.size_bytes > 0 and extent.size_bytes % self.granule_bytes == 0, extent
            assert not (kind == previous == "free"), f"free extents not coalesced at {position}"
            position, previous = extent.end_bytes, kind
        assert position == self.capacity_bytes, "extents do not tile the capacity"
        assert sum(self._free_sizes) == self._free_bytes, "free byte counter drifted"
