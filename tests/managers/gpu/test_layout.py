"""Splitting by module: contiguous runs that minimise the most loaded device; on real models
every module's own tensors land in one shard."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.gpu import GpuManager
from arl_tangram.managers.gpu.layout import plan_host_layout, split_units


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 1000), min_size=1, max_size=40), parts=st.integers(1, 8))
def test_split_units_is_an_optimal_contiguous_partition(sizes: list[int], parts: int) -> None:
    runs = split_units(sizes, parts)
    assert [i for r in runs for i in r] == list(range(len(sizes)))
    assert len(runs) == min(parts, len(sizes))
    worst = max(sum(sizes[i] for i in r) for r in runs)
    assert worst >= max(sizes)
    if parts == 2 and len(sizes) >= 2:  # brute force the best single cut
        best = min(max(sum(sizes[:c]), sum(sizes[c:])) for c in range(1, len(sizes)))
        assert worst == best


def test_host_layout_is_aligned_and_tight() -> None:
    layout = plan_host_layout([10, 0, 300, 256], 256)
    assert layout.offsets_bytes == (0, 256, 256, 768)
    assert layout.total_bytes == 1024 and layout.payload_bytes == 566


def _owner_shards(manager: GpuManager, service: str, num_devices: int) -> dict[str, set[int]]:
    """Module name -> shards holding its own tensors, for a replica over ``num_devices``."""
    model = manager._services[service]
    shards = model.shards(num_devices)
    shard_of = {}
    for s, shard in enumerate(shards):
        for index in range(shard.first_tensor, shard.stop_tensor):
            shard_of[index] = s
    owners: dict[str, set[int]] = {}
    for index, ref in enumerate(model.refs):
        names = [ref.param_name.rsplit(".", 1)[0]] if ref.param_name else []
        names += [owner for owner, _ in ref.buffer_owners]
        for name in names:
            owners.setdefault(name, set()).add(shard_of[index])
    return owners


@pytest.mark.parametrize("service", ["teacher", "minilm"])
def test_real_models_are_cut_only_at_module_boundaries(
    make_manager: Callable[..., GpuManager],
    teacher_folders: list[Path],
    request: pytest.FixtureRequest,
    service: str,
) -> None:
    manager = make_manager([256 << 20])
    if service == "minilm":
        manager.register_folder("minilm", request.getfixturevalue("minilm"), "embed")
    else:
        manager.register_folder("teacher", teacher_folders[0], "logprobs")
    total = manager.footprint_bytes(service, 1)
    for parts in (2, 4, 8):
        owners = _owner_shards(manager, service, parts)
        split = {name: s for name, s in owners.items() if len(s) > 1}
        assert not split, (service, parts, split)
        assert len(manager._services[service].shards(parts)) == parts
        assert manager.footprint_bytes(service, parts) < total
    if service == "minilm":  # BERT's embeddings own position_ids and have children
        assert len(_owner_shards(manager, "minilm", 8)["embeddings"]) == 1
