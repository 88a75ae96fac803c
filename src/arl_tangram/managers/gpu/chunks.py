"""Core-style accounting (no torch): aligned {1, 2, 4, 8}-device chunks across a node's GPUs.

GPUs that share a fast link come in aligned groups (0-1, 0-3, 0-7), so a service that needs
``k`` devices gets an aligned chunk of ``k``: devices ``[s, s + k)`` with ``s % k == 0``.
Per-level occupancy bitmaps (bit ``i`` of level ``L`` set iff some device of the ``i``-th
aligned chunk of ``2**L`` devices is occupied) answer "is this chunk free" in O(1).

Occupancy is a reference count per device: a device hosting resident weights of any service
is occupied. ``ranked_chunks`` orders candidates so that a request prefers a free chunk whose
enclosing free chunk is smallest (best fit: do not break a free 8-chunk for a 1-device
service when a free device inside a busy pair exists), then the least occupied busy chunk.

Not thread-safe: the owner serialises calls.
"""

from __future__ import annotations

LEVEL_SIZES = (1, 2, 4, 8)


class ChunkModel:
    """Aligned device chunks over ``num_devices`` devices of one node."""

    def __init__(self, num_devices: int) -> None:
        if num_devices <= 0:
            raise ValueError(f"num_devices must be positive, got {num_devices}")
        self.num_devices = num_devices
        self.level_sizes = tuple(s for s in LEVEL_SIZES if s <= num_devices)
        self._refcounts = [0] * num_devices
        self._bitmaps = [0] * len(self.level_sizes)

    def bitmap(self, size: int) -> int:
        """Occupancy bitmap of the level with chunks of ``size`` devices."""
        return self._bitmaps[self._level(size)]

    def _level(self, size: int) -> int:
        if size not in self.level_sizes:
            raise ValueError(
                f"chunk size must be one of {self.level_sizes} on {self.num_devices} devices, got {size}"
            )
        return self.level_sizes.index(size)

    def chunk_starts(self, size: int) -> list[int]:
        """Starts of all aligned chunks of ``size`` devices that lie inside the node."""
        self._level(size)
        return list(range(0, self.num_devices - size + 1, size))

    def is_free(self, start: int, size: int) -> bool:
        return not self._bitmaps[self._level(size)] >> (start // size) & 1

    def occupancy(self, device: int) -> int:
        return self._refcounts[device]

    def _enclosing_free_size(self, start: int, size: int) -> int:
        best = size
        for bigger in self.level_sizes:
            if bigger > size:
                outer = start // bigger * bigger
                if outer + bigger <= self.num_devices and self.is_free(outer, bigger):
                    best = bigger
        return best

    def ranked_chunks(self, size: int) -> list[int]:
        """Candidate starts for a ``size``-device service, most preferred first.

        Free chunks first, smallest enclosing free chunk first, then busy chunks by total
        occupancy; ties by lowest start (determinism).
        """

        def key(start: int) -> tuple[int, int, int]:
            if self.is_free(start, size):
                return (0, self._enclosing_free_size(start, size), start)
            load = sum(self._refcounts[start : start + size])
            return (1, load, start)

        return sorted(self.chunk_starts(size), key=key)

    def allocate(self, size: int) -> int | None:
        """Claim the best free aligned chunk of ``size`` devices; ``None`` if none is free."""
        for start in self.ranked_chunks(size):
            if self.is_free(start, size):
                self.occupy(range(start, start + size))
                return start
        return None

    def free(self, start: int, size: int) -> None:
        """Release a chunk claimed by ``allocate``."""
        if start % size or start + size > self.num_devices:
            raise ValueError(f"chunk [{start}, {start + size}) is not aligned to {size}")
        self.release(range(start, start + size))

    def occupy(self, devices: range | list[int]) -> None:
        for device in devices:
            self._refcounts[device] += 1
            if self._refcounts[device] == 1:
                self._set_bits(device, True)

    def release(self, devices: range | list[int]) -> None:
        for device in devices:
            if self._refcounts[device] <= 0:
                raise ValueError(f"device {device} released more often than occupied")
            self._refcounts[device] -= 1
            if self._refcounts[device] == 0:
                self._set_bits(device, False)

    def _set_bits(self, device: int, occupied: bool) -> None:
        for level, size in enumerate(self.level_sizes):
            start = device // size * size
            if occupied:
                self._bitmaps[level] |= 1 << (start // size)
            elif not any(self._refcounts[start : start + size]):
                self._bitmaps[level] &= ~(1 << (start // size))

    def check_invariants(self) -> None:
        for level, size in enumerate(self.level_sizes):
            for start in self.chunk_starts(size):
                busy = any(self._refcounts[start : start + size])
                assert bool(self._bitmaps[level] >> (start // size) & 1) == busy, (size, start)
