"""Aligned {1, 2, 4, 8}-device chunks with per-level occupancy bitmaps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.gpu.chunks import ChunkModel


def test_chunks_are_aligned_to_their_size() -> None:
    model = ChunkModel(8)
    assert model.allocate(2) == 0
    assert model.allocate(4) == 4  # the aligned quad 4-7, never 2-5
    assert model.allocate(1) == 2
    assert model.allocate(2) is None  # 3 is free, but the pair 2-3 is not
    assert model.allocate(1) == 3
    model.check_invariants()


def test_small_requests_do_not_break_larger_free_chunks() -> None:
    model = ChunkModel(8)
    model.occupy([0])  # device 0 busy: device 1 is the best home for a 1-device service
    assert model.allocate(1) == 1
    assert model.allocate(4) == 4
    model.free(4, 4)
    assert model.allocate(8) is None
    model.free(1, 1)
    model.release([0])
    assert model.allocate(8) == 0


def test_bitmaps_track_occupancy_per_level() -> None:
    model = ChunkModel(8)
    model.occupy([5])
    assert model.bitmap(1) == 1 << 5
    assert model.bitmap(2) == 1 << 2
    assert model.bitmap(4) == 1 << 1
    assert model.bitmap(8) == 1
    model.occupy([5])
    model.release([5])
    assert model.bitmap(8) == 1  # still referenced once
    model.release([5])
    assert [model.bitmap(s) for s in (1, 2, 4, 8)] == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        model.release([5])


def test_node_without_a_power_of_two_of_devices() -> None:
    model = ChunkModel(6)
    assert model.level_sizes == (1, 2, 4)
    assert model.chunk_starts(4) == [0]
    assert model.allocate(4) == 0
    assert model.allocate(2) == 4
    assert model.allocate(2) is None
    with pytest.raises(ValueError, match="chunk size"):
        model.allocate(8)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from([1, 2, 4, 8]), st.booleans(), st.integers(0, 100)), max_size=60
    )
)
def test_random_claims_never_overlap(ops: list[tuple[int, bool, int]]) -> None:
    model = ChunkModel(8)
    live: list[tuple[int, int]] = []
    for size, release, pick in ops:
        if release and live:
            start, chunk = live.pop(pick % len(live))
            model.free(start, chunk)
        else:
            start = model.allocate(size)
            busy = {d for s, c in live for d in range(s, s + c)}
            if start is None:  # refused only when no aligned chunk is entirely free
                assert all(busy & set(range(s, s + size)) for s in range(0, 8, size))
            else:
                assert start % size == 0 and not busy & set(range(start, start + size))
                live.append((start, size))
        model.check_invariants()
