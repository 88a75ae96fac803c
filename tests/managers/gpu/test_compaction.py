"""Compaction: plans keep the buddy invariants, move only what may move, coalesce free space."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.gpu.buddy import Block, BuddyModel
from arl_tangram.managers.gpu.compaction import (
    Move,
    final_blocks,
    fits_after_compaction,
    plan_compaction,
    plan_room,
)

MIN = 256


def make_state(
    capacity_units: int, sizes_units: list[int], drop: list[int]
) -> tuple[BuddyModel, dict[str, list[Block]]]:
    """Builder: allocate one block per size (owner ``o<i>``), then free the ``drop`` ones."""
    model = BuddyModel(capacity_units * MIN, MIN)
    owners: dict[str, list[Block]] = {}
    for i, units in enumerate(sizes_units):
        block = model.allocate(units * MIN)
        if block is not None:
            owners[f"o{i:03d}"] = [block]
    for i in drop:
        name = f"o{i % max(len(sizes_units), 1):03d}"
        if name in owners:
            model.free(owners.pop(name)[0].offset_bytes)
    return model, owners


def replay_bytes(capacity: int, owners: dict[str, list[Block]], moves: list[Move]) -> bytearray:
    """Simulated arena: each block tagged with its owner's id, then the plan's copies in order."""
    memory = bytearray(capacity)
    for tag, (_, blocks) in enumerate(sorted(owners.items()), start=1):
        for block in blocks:
            memory[block.offset_bytes : block.end_bytes] = bytes([tag]) * block.size_bytes
    for move in moves:
        src, dst = move.source, move.target
        assert dst.end_bytes <= src.offset_bytes or src.end_bytes <= dst.offset_bytes
        memory[dst.offset_bytes : dst.end_bytes] = memory[src.offset_bytes : src.end_bytes]
    return memory


layouts = st.tuples(
    st.integers(1, 300),
    st.lists(st.integers(1, 40), max_size=40),
    st.lists(st.integers(0, 100), max_size=30),
)


@settings(max_examples=150, deadline=None)
@given(layout=layouts)
def test_full_compaction_coalesces_and_keeps_every_byte(
    layout: tuple[int, list[int], list[int]],
) -> None:
    model, owners = make_state(*layout)
    moves = plan_compaction(model, owners)
    model.check_invariants()
    after = {**owners, **final_blocks(owners, moves)}
    memory = replay_bytes(model.capacity_bytes, owners, moves)
    for tag, (_, blocks) in enumerate(sorted(after.items()), start=1):
        for block in blocks:
            assert memory[block.offset_bytes : block.end_bytes] == bytes([tag]) * block.size_bytes
    held = sorted((b for bs in after.values() for b in bs), key=lambda b: b.offset_bytes)
    assert held == model.allocated_blocks()
    for root in model.roots:  # everything idle was movable: free sizes distinct per root
        sizes = [
            b.size_bytes
            for b in model.free_blocks()
            if root.offset_bytes <= b.offset_bytes < root.end_bytes
        ]
        assert len(sizes) == len(set(sizes)), sizes
    if len(model.roots) == 1 and model.free_bytes:
        top = 1 << (model.free_bytes.bit_length() - 1)
        assert model.largest_free_block_bytes() == top


@settings(max_examples=100, deadline=None)
@given(layout=layouts, pinned=st.sets(st.integers(0, 40)))
def test_pinned_blocks_never_move(
    layout: tuple[int, list[int], list[int]], pinned: set[int]
) -> None:
    model, owners = make_state(*layout)
    movable = {name: blocks for name, blocks in owners.items() if int(name[1:]) not in pinned}
    before = {name: blocks for name, blocks in owners.items() if name not in movable}
    moves = plan_compaction(model, movable)
    assert all(move.owner in movable for move in moves)
    allocated = {b.offset_bytes for b in model.allocated_blocks()}
    assert all(b.offset_bytes in allocated for bs in before.values() for b in bs)
    model.check_invariants()


@settings(max_examples=100, deadline=None)
@given(layout=layouts, want=st.lists(st.integers(1, 64), min_size=1, max_size=4))
def test_plan_room_is_the_shortest_prefix_that_makes_room(
    layout: tuple[int, list[int], list[int]], want: list[int]
) -> None:
    model, owners = make_state(*layout)
    sizes = [model.block_size_for(w * MIN) for w in want]
    fits_now = model.clone().allocate_all(sizes) is not None
    full = plan_compaction(model.clone(), owners)
    moves = plan_room(model, owners, sizes)
    if fits_now:
        assert moves == []
    if fits_after_compaction(model, owners, sizes):
        assert moves is not None
    if moves is not None:
        assert moves == full[: len(moves)]
        assert model.allocate_all(sizes) is not None
    model.check_invariants()


def test_allocate_below_stays_below_the_limit() -> None:
    model = BuddyModel(16 * MIN, MIN)
    blocks = [model.allocate(MIN) for _ in range(16)]
    assert all(b is not None for b in blocks)
    for b in blocks[::2]:
        assert b is not None
        model.free(b.offset_bytes)
    assert model.allocate_below(MIN, 0) is None
    assert model.allocate_below(2 * MIN, 15 * MIN) is None  # only single free units below
    got = model.allocate_below(MIN, 9 * MIN)
    assert got == Block(0, MIN)


def test_compaction_merges_holes_so_a_large_block_fits() -> None:
    model = BuddyModel(8 * MIN, MIN)
    owners = {f"o{i}": [model.allocate(MIN)] for i in range(8)}
    for name in ("o0", "o2", "o4", "o6"):
        model.free(owners.pop(name)[0].offset_bytes)  # type: ignore[union-attr]
    assert model.allocate_all([4 * MIN]) is None
    moves = plan_room(model, owners, [4 * MIN])  # type: ignore[arg-type]
    assert moves is not None and 1 <= len(moves) <= 2
    assert model.allocate_all([4 * MIN]) is not None
    model.check_invariants()
