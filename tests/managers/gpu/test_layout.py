"""Layouts: tensors packed into power-of-two blocks, aligned, without overlap, little waste."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.gpu.layout import plan_layout, split_balanced


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3_000_000), min_size=1, max_size=60),
    granule_log=st.integers(10, 20),
)
def test_layout_slots_fit_their_blocks_without_overlap(sizes: list[int], granule_log: int) -> None:
    granule = 1 << granule_log
    layout = plan_layout(sizes, granule, align_bytes=256)
    assert all(
        b % granule == 0 and (b // granule) & (b // granule - 1) == 0
        for b in layout.block_sizes_bytes
    )
    assert sorted(s.index for s in layout.slots) == list(range(len(sizes)))
    per_block: dict[int, list[tuple[int, int]]] = {}
    for slot in layout.slots:
        assert slot.offset_bytes % 256 == 0
        assert slot.nbytes == sizes[slot.index]
        assert slot.offset_bytes + slot.nbytes <= layout.block_sizes_bytes[slot.block]
        per_block.setdefault(slot.block, []).append((slot.offset_bytes, max(slot.nbytes, 1)))
    for spans in per_block.values():
        spans.sort()
        assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert layout.total_bytes >= sum(sizes)


def test_layout_of_a_transformer_wastes_little() -> None:
    hidden, inter, vocab = 512, 1376, 8000
    layer = [hidden * hidden * 4] * 4 + [hidden * inter * 4] * 3 + [hidden * 4] * 2
    sizes = [vocab * hidden * 4] + layer * 6 + [hidden * 4, vocab * hidden * 4]
    layout = plan_layout(sizes, 64 << 10)
    assert layout.total_bytes <= 1.06 * sum(sizes)
    assert len(layout.block_sizes_bytes) <= 8


def test_split_balanced_keeps_order_and_balance() -> None:
    parts = split_balanced([10] * 8, 2)
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7]]
    parts = split_balanced([100, 1, 1, 1], 2)
    assert parts[0] == [0] and parts[1] == [1, 2, 3]
    assert split_balanced([5, 5], 4)[0] == [0]
