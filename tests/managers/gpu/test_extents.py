"""Extent accounting and sliding compaction plans (pure accounting, property-tested)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.gpu.compaction import apply_move, fits_after_compaction, next_move
from arl_tangram.managers.gpu.extents import Extent, ExtentModel

GRANULE = 1 << 16


def test_a_large_single_tensor_takes_its_size_not_a_power_of_two() -> None:
    model = ExtentModel(512 << 20, 2 << 20)
    extent = model.allocate(160 << 20)
    assert extent == Extent(0, 160 << 20)
    assert model.free_bytes == 352 << 20 and model.largest_free_extent_bytes() == 352 << 20


def test_free_coalesces_and_double_free_raises() -> None:
    model = ExtentModel(10 * GRANULE, GRANULE)
    a, b, c = (model.allocate(GRANULE) for _ in range(3))
    assert a and b and c
    model.free(a.offset_bytes)
    model.free(c.offset_bytes)
    assert model.largest_free_extent_bytes() == 8 * GRANULE  # c merged with the top
    model.free(b.offset_bytes)
    assert model.free_extents() == [Extent(0, 10 * GRANULE)]
    with pytest.raises(ValueError):
        model.free(b.offset_bytes)
    model.check_invariants()


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=60))
def test_churn_then_full_slide_leaves_one_hole(ops: list[tuple[bool, int]]) -> None:
    model = ExtentModel(256 * GRANULE, GRANULE)
    held: list[int] = []
    for allocate, units in ops:
        if allocate or not held:
            extent = model.allocate(units * GRANULE)
            if extent is not None:
                held.append(extent.offset_bytes)
        else:
            model.free(held.pop(units % len(held)))
        model.check_invariants()
    free = model.free_bytes
    assert fits_after_compaction(model, set(held), free) == (free > 0)
    while (
        move := next_move(
            model,
            set(model.used_extents()[i].offset_bytes for i in range(len(model.used_extents()))),
        )
    ) is not None:
        apply_move(model, move)
        model.check_invariants()
    assert model.free_bytes == free
    assert model.largest_free_extent_bytes() == free  # every free byte in one hole


def test_an_immovable_extent_stays_and_bounds_the_hole() -> None:
    model = ExtentModel(8 * GRANULE, GRANULE)
    a, b, c = (model.allocate(2 * GRANULE) for _ in range(3))
    assert a and b and c
    model.free(a.offset_bytes)
    assert next_move(model, {c.offset_bytes}) is None  # c has no hole below it
    assert next_move(model, {b.offset_bytes}) is not None
    assert not fits_after_compaction(model, {c.offset_bytes}, 3 * GRANULE)
    assert fits_after_compaction(model, {b.offset_bytes, c.offset_bytes}, 4 * GRANULE)
