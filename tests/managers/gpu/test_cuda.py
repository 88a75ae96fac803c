"""CUDA only (skipped elsewhere; run by ``scripts/device_gpu_check.sh``): device memory goes
back to its baseline after evict and after close; replicas split over ``cuda:0`` + ``cpu``
answer like a whole one; library allocations land on the replica's device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arl_tangram.managers.gpu import DeviceSpec, GpuManager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOKENS = [5, 17, 300, 1024, 7]


def test_memory_returns_to_baseline_after_evict_and_close(teacher_folders: list[Path]) -> None:
    torch.cuda.synchronize()
    before_manager = torch.cuda.memory_allocated(0)
    manager = GpuManager([DeviceSpec("cuda:0", "cuda:0", "cuda", 256 << 20)])
    manager.register_folder("t", teacher_folders[0], "logprobs")
    assert manager._services["t"].host.is_pinned()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated(0)
    for i in range(3):
        manager.load(f"r{i}", "t", [0])
        manager.run(f"r{i}", {"tokens": TOKENS})
        manager.evict(f"r{i}")
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated(0) == baseline
    manager.close()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(0) == before_manager


def test_split_over_cuda_and_cpu_matches_whole(teacher_folders: list[Path]) -> None:
    devices = [
        DeviceSpec("cuda:0", "cuda:0", "cuda", 128 << 20),
        DeviceSpec("cpu:1", "cpu", "cpu", 128 << 20),
    ]
    with GpuManager(devices) as manager:
        manager.register_folder("t", teacher_folders[1], "logprobs")
        manager.load("split", "t", [0, 1])
        manager.load("whole", "t", [0])
        split = manager.run("split", {"tokens": TOKENS})["token_logprobs"][1:]
        whole = manager.run("whole", {"tokens": TOKENS})["token_logprobs"][1:]
        torch.testing.assert_close(torch.tensor(split), torch.tensor(whole), rtol=0, atol=1e-4)
