"""Core: aligned {1,2,4,8}-device chunks on a GPU node, kept as an occupancy bitmask.

Bit ``d`` of ``used_mask`` is set while device ``d`` is held. A chunk of size ``s`` starts
at a multiple of ``s`` (NVLink-local, buddy-aligned) so the node never fragments into
unusable holes. Per-level occupancy follows from the mask: a level-``s`` block is free
iff all its bits are clear.
"""

from __future__ import annotations


def chunk_mask(offset: int, size: int) -> int:
    return ((1 << size) - 1) << offset


def free_chunks(used_mask: int, size: int, devices: int) -> list[int]:
    """Offsets of the free aligned chunks of ``size`` on a node of ``devices`` devices."""
    if size > devices:
        return []
    return [o for o in range(0, devices, size) if not used_mask & chunk_mask(o, size)]


def best_chunk(used_mask: int, size: int, devices: int) -> int | None:
    """The free aligned chunk whose enclosing buddy blocks are fullest (best fit), or None.

    Filling already-broken blocks first keeps large aligned blocks whole for later
    multi-device services; ties go to the lowest offset for determinism.
    """
    best: tuple[int, int] | None = None
    for offset in free_chunks(used_mask, size, devices):
        score = 0
        block = size * 2
        while block <= devices:
            start = offset - offset % block
            score = score * 16 + bin(used_mask & chunk_mask(start, block)).count("1")
            block *= 2
        if best is None or score > best[0]:
            best = (score, offset)
    return None if best is None else best[1]


def largest_free_chunk(used_mask: int, devices: int) -> int:
    size = devices
    while size >= 1:
        if free_chunks(used_mask, size, devices):
            return size
        size //= 2
    return 0
