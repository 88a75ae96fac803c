"""Buddy allocator: alignment, no overlap, conservation, coalescing (property tests)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.gpu.buddy import Block, BuddyModel, binary_decomposition

MIN = 256


def test_roots_cover_a_capacity_that_is_not_a_power_of_two() -> None:
    model = BuddyModel(11 * MIN, MIN)
    assert [(b.offset_bytes, b.size_bytes) for b in model.roots] == [
        (0, 8 * MIN),
        (8 * MIN, 2 * MIN),
        (10 * MIN, MIN),
    ]
    assert model.free_bytes == 11 * MIN
    model.check_invariants()


def test_block_is_best_fit_lowest_address_and_rounds_to_power_of_two() -> None:
    model = BuddyModel(16 * MIN, MIN)
    first = model.allocate(3 * MIN)
    second = model.allocate(MIN)
    assert first == Block(0, 4 * MIN)
    assert second == Block(
        4 * MIN, MIN
    )  # splits the free 4-block next to ``first``, not the 8-block
    model.check_invariants()


def test_freeing_everything_coalesces_to_one_block() -> None:
    model = BuddyModel(64 * MIN, MIN)
    blocks = [model.allocate(MIN) for _ in range(64)]
    assert model.allocate(MIN) is None
    for block in blocks[::2] + blocks[1::2]:
        assert block is not None
        model.free(block.offset_bytes)
    assert model.free_blocks() == [Block(0, 64 * MIN)]


def test_allocate_all_is_all_or_nothing() -> None:
    model = BuddyModel(8 * MIN, MIN)
    assert model.allocate_all([4 * MIN, 4 * MIN, MIN]) is None
    assert model.free_bytes == 8 * MIN
    got = model.allocate_all([MIN, 4 * MIN, 2 * MIN])
    assert got is not None and [b.size_bytes for b in got] == [MIN, 4 * MIN, 2 * MIN]
    model.check_invariants()


def test_double_free_and_bad_sizes_raise() -> None:
    model = BuddyModel(8 * MIN, MIN)
    block = model.allocate(MIN)
    assert block is not None
    model.free(block.offset_bytes)
    with pytest.raises(ValueError, match="not an allocated block"):
        model.free(block.offset_bytes)
    with pytest.raises(ValueError):
        model.allocate(0)
    with pytest.raises(ValueError):
        BuddyModel(1024, 300)
    assert model.allocate(16 * MIN) is None


def test_binary_decomposition() -> None:
    assert binary_decomposition(13 * MIN, MIN) == [8 * MIN, 4 * MIN, MIN]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 40 * MIN)),
        st.tuples(st.just("free"), st.integers(0, 10_000)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(capacity_units=st.integers(1, 300), operations=ops)
def test_random_operations_keep_the_invariants(
    capacity_units: int, operations: list[tuple[str, int]]
) -> None:
    model = BuddyModel(capacity_units * MIN, MIN)
    live: list[Block] = []
    for op, value in operations:
        if op == "alloc":
            block = model.allocate(value)
            if block is not None:
                assert block.size_bytes >= value
                assert block.offset_bytes % block.size_bytes == 0  # aligned to its own size
                assert all(
                    block.end_bytes <= o.offset_bytes or o.end_bytes <= block.offset_bytes
                    for o in live
                )
                live.append(block)
            else:  # a refusal is honest: no free block is large enough
                assert model.largest_free_block_bytes() < model.block_size_for(value)
        elif live:
            model.free(live.pop(value % len(live)).offset_bytes)
        model.check_invariants()
        assert model.free_bytes + sum(b.size_bytes for b in live) == model.capacity_bytes
    for block in live:
        model.free(block.offset_bytes)
    assert [(b.offset_bytes, b.size_bytes) for b in model.free_blocks()] == [
        (r.offset_bytes, r.size_bytes) for r in model.roots
    ]


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=12), capacity_units=st.integers(1, 200)
)
def test_allocate_all_of_powers_of_two_fits_exactly_when_the_sum_fits(
    sizes: list[int], capacity_units: int
) -> None:
    """Largest-first placement of power-of-two blocks into an empty arena never wastes space."""
    model = BuddyModel(capacity_units * MIN, MIN)
    blocks = [model.block_size_for(s * MIN) for s in sizes]
    got = model.allocate_all(blocks)
    fits_by_roots = _fits(sorted(blocks, reverse=True), [r.size_bytes for r in model.roots])
    assert (got is not None) == fits_by_roots
    model.check_invariants()


def _fits(blocks: list[int], roots: list[int]) -> bool:
    """Reference: greedy change-making of power-of-two blocks into the roots (exact for powers of two)."""
    free = sorted(roots, reverse=True)
    for block in blocks:
        candidates = [f for f in free if f >= block]
        if not candidates:
            return False
        chosen = min(candidates)
        free.remove(chosen)
        while chosen > block:
            chosen //= 2
            free.append(chosen)
    return True
