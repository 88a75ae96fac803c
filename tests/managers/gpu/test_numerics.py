"""Evict -> swap-in restores a service bit for bit, and the weights really live in the arena."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from arl_tangram.managers.gpu import GpuManager
from arl_tangram.managers.gpu.models import minilm_path

TOKENS = [5, 17, 300, 1024, 7, 7, 2048, 4000, 12, 99]


def _arena_range(manager: GpuManager, device: int) -> tuple[int, int]:
    buffer = manager._residency.arenas[device].buffer
    return buffer.data_ptr(), buffer.data_ptr() + buffer.numel()


def test_logprobs_identical_after_evict_and_swap_in(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([64 << 20])
    manager.register_folder("teacher", teacher_folders[0], "logprobs")
    before = manager.call_sync("teacher", {"tokens": TOKENS})
    service = manager._services["teacher"]
    low, high = _arena_range(manager, 0)
    assert all(low <= p.data_ptr() < high for p in service.model.module.parameters())  # type: ignore[union-attr]
    assert manager.evict("teacher")
    assert not any(low <= p.data_ptr() < high for p in service.model.module.parameters())  # type: ignore[union-attr]
    manager._residency.arenas[0].buffer.fill_(0xFF)  # stale arena bytes must not matter
    after = manager.call_sync("teacher", {"tokens": TOKENS})
    assert after == before  # exact float equality, element by element
    status = manager.status()["services"]["teacher"]
    assert status["num_swap_ins"] == 2 and status["num_evictions"] == 1


def test_embeddings_identical_after_being_evicted_by_another_service(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([90 << 20])  # MiniLM (88 MiB) and a teacher cannot both be resident
    manager.register_folder("minilm", minilm_path(), "embed")
    manager.register_folder("teacher", teacher_folders[1], "logprobs")
    request = {"input": ["The quick brown fox.", "Evict on execution."]}
    before = manager.call_sync("minilm", request)
    manager.call_sync("teacher", {"tokens": TOKENS})  # forces MiniLM out
    assert manager.status()["services"]["minilm"]["state"] == "host"
    after = manager.call_sync("minilm", request)
    assert after == before
    assert manager.status()["services"]["minilm"]["num_evictions"] == 1


def test_host_backup_is_not_pinned_without_cuda(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([32 << 20])
    manager.register_folder("teacher", teacher_folders[0], "logprobs")
    host = manager._services["teacher"].shards[0].host
    assert host.device.type == "cpu" and not host.is_pinned()
    assert not torch.cuda.is_available() or manager._pin_host


def test_two_device_service_matches_one_device_service(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([16 << 20, 16 << 20])
    manager.register_folder("whole", teacher_folders[2], "logprobs")
    manager.register_folder("split", teacher_folders[2], "logprobs", num_devices=2)
    split = manager.call_sync("split", {"tokens": TOKENS})
    whole = manager.call_sync("whole", {"tokens": TOKENS})
    assert split == whole
    assert manager.status()["services"]["split"]["resident_on"] == ["cpu:0", "cpu:1"]
