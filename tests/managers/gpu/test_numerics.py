"""Evict -> load restores a replica bit for bit; weights really live in the arena; the host
copy is pinned exactly when a CUDA device is used, at its exact size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from arl_tangram.managers.gpu import GpuManager

TOKENS = [5, 17, 300, 1024, 7, 7, 2048, 4000, 12, 99]


def _in_arena(manager: GpuManager, device: int, tensor: torch.Tensor) -> bool:
    buffer = manager._arenas[device].buffer
    return buffer.data_ptr() <= tensor.data_ptr() < buffer.data_ptr() + buffer.numel()


def test_logprobs_identical_after_evict_and_reload(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([64 << 20])
    manager.register_folder("teacher", teacher_folders[0], "logprobs")
    manager.load("r1", "teacher", [0])
    before = manager.run("r1", {"tokens": TOKENS})
    module = manager._replicas["r1"].model.module  # type: ignore[union-attr]
    assert all(_in_arena(manager, 0, p) for p in module.parameters())
    host = manager._services["teacher"].model.module  # type: ignore[union-attr]
    assert not any(_in_arena(manager, 0, p) for p in host.parameters())
    manager.evict("r1")
    manager._arenas[0].buffer.fill_(0xFF)  # stale arena bytes must not matter
    manager.load("r2", "teacher", [0])
    assert manager.run("r2", {"tokens": TOKENS}) == before  # exact float equality


def test_two_replicas_of_one_service_serve_from_their_own_copies(
    make_manager: Callable[..., GpuManager], minilm: Path
) -> None:
    manager = make_manager([200 << 20])
    manager.register_folder("minilm", minilm, "embed")
    request = {"input": ["The quick brown fox.", "Evict on execution."]}
    manager.load("a", "minilm", [0])
    manager.load("b", "minilm", [0])
    pa = next(manager._replicas["a"].model.module.parameters())  # type: ignore[union-attr]
    pb = next(manager._replicas["b"].model.module.parameters())  # type: ignore[union-attr]
    assert pa.data_ptr() != pb.data_ptr()
    assert manager.run("a", request) == manager.run("b", request)
    manager.evict("a")
    assert manager.run("b", request)["data"][0]["index"] == 0
    assert manager.status()["services"]["minilm"]["replicas"] == ["b"]


def test_host_copy_is_pinned_iff_a_cuda_device_is_used_and_has_its_exact_size(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([32 << 20])
    manager.register_folder("teacher", teacher_folders[0], "logprobs")
    service = manager._services["teacher"]
    on_cuda = manager.devices[0].kind == "cuda"
    assert service.host.device.type == "cpu"
    assert service.host.is_pinned() == on_cuda
    info = manager.service_info("teacher")
    assert service.host.untyped_storage().nbytes() == info.host_bytes  # no power-of-two rounding
    assert info.host_bytes - info.weight_bytes < 256 * len(service.refs)


def test_replica_split_over_two_devices_matches_one_device(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([16 << 20, 16 << 20])
    manager.register_folder("teacher", teacher_folders[2], "logprobs")
    manager.load("whole", "teacher", [1])
    manager.load("split", "teacher", [0, 1])
    assert manager.run("split", {"tokens": TOKENS}) == manager.run("whole", {"tokens": TOKENS})
    assert manager.status()["replicas"]["split"]["devices"][1].endswith("1")
    two = manager.footprint_bytes("teacher", 2)
    assert two < manager.footprint_bytes("teacher", 1)
    assert max(manager.status()["replicas"]["split"]["extent_bytes"]) == two
