"""Relocation inside the arena: outputs bit for bit, in-use services stay put, holes merge."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from arl_tangram.managers.gpu import GpuManager
from arl_tangram.managers.gpu.buddy import binary_decomposition
from arl_tangram.managers.gpu.models import generate_causal_lm

TOKENS = [5, 17, 300, 1024, 7, 7, 2048, 4000, 12, 99]


def _fragmented(
    make_manager: Callable[..., GpuManager],
    folders: list[Path],
    footprint: int,
    room: int = 4,
    **config: object,
) -> GpuManager:
    """Four teachers loaded into room for ``room``, then the 1st and 3rd evicted: two holes."""
    manager = make_manager([room * footprint], **config)
    for i, folder in enumerate(folders[:4]):
        manager.register_folder(f"t{i}", folder, "logprobs")
        manager.prefetch(f"t{i}")
    assert manager.evict("t0") and manager.evict("t2")
    return manager


def _poison_free_space(manager: GpuManager) -> None:
    """Stale bytes in free blocks must not matter to any resident service."""
    arena = manager._residency.arenas[0]
    for block in arena.allocator.free_blocks():
        arena.bytes_view(block.offset_bytes, block.size_bytes).fill_(0xFF)


def test_relocated_services_answer_bit_for_bit(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path], teacher_footprint: int
) -> None:
    manager = _fragmented(make_manager, teacher_folders, teacher_footprint)
    before = {n: manager.call_sync(n, {"tokens": TOKENS}) for n in ("t1", "t3")}
    offsets = {n: manager._services[n].placement for n in ("t1", "t3")}
    manager.compact()
    device = manager.status()["devices"][0]
    assert device["num_relocations"] > 0 and device["relocated_bytes"] > 0
    assert any(manager._services[n].placement != offsets[n] for n in ("t1", "t3"))
    _poison_free_space(manager)
    for name, expected in before.items():
        assert manager.call_sync(name, {"tokens": TOKENS}) == expected
    assert all(manager.status()["services"][n]["num_swap_ins"] == 1 for n in ("t1", "t3"))


def test_a_service_in_use_is_never_moved(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path], teacher_footprint: int
) -> None:
    manager = _fragmented(make_manager, teacher_folders, teacher_footprint)
    pinned = manager._services["t3"]
    with manager._cond:
        pinned.in_use += 1  # what ``_acquire`` does for a running batch
    before = pinned.placement
    manager.compact()
    assert pinned.placement == before
    with manager._cond:
        pinned.in_use -= 1
    manager.compact()
    assert manager.call_sync("t3", {"tokens": TOKENS})["tokens"] == TOKENS


def test_compaction_coalesces_free_space_when_everything_is_idle(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path], teacher_footprint: int
) -> None:
    manager = _fragmented(make_manager, teacher_folders, teacher_footprint)
    manager.compact()
    allocator = manager._residency.arenas[0].allocator
    for root in allocator.roots:  # free sizes distinct per root: every fitting layout fits
        sizes = [
            b.size_bytes
            for b in allocator.free_blocks()
            if root.offset_bytes <= b.offset_bytes < root.end_bytes
        ]
        assert len(sizes) == len(set(sizes))
        if sizes:  # so the largest free block is the top power of two of the root's free bytes
            assert max(sizes) == 1 << (sum(sizes).bit_length() - 1)
            want = binary_decomposition(sum(sizes), allocator.min_block_bytes)
            assert allocator.clone().allocate_all(want) is not None


def test_relocation_makes_room_before_anything_is_evicted(
    make_manager: Callable[..., GpuManager],
    teacher_folders: list[Path],
    teacher_footprint: int,
    model_cache: Path,
) -> None:
    manager = _fragmented(
        make_manager, teacher_folders, teacher_footprint, room=5, compaction="on_demand"
    )
    big = generate_causal_lm(model_cache, 6_000_000, seed=11)
    status = manager.register_folder("big", big, "logprobs")
    allocator = manager._residency.arenas[0].allocator
    assert status.footprint_bytes <= allocator.free_bytes
    assert (
        allocator.clone().allocate_all(manager._services["big"].shards[0].layout.block_sizes_bytes)
        is None
    )
    manager.call_sync("big", {"tokens": TOKENS})
    services = manager.status()["services"]
    assert services["t1"]["state"] == services["t3"]["state"] == "resident"
    assert manager.status()["devices"][0]["num_relocations"] > 0
