"""Fixtures of the GPU manager tests: generated teacher LMs (session cache), CPU devices."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from arl_tangram.managers.gpu import GpuManager, GpuManagerConfig, cpu_devices  # noqa: E402
from arl_tangram.managers.gpu.models import generate_causal_lm  # noqa: E402

TEACHER_BYTES = 3_000_000  # small on purpose: the suite must stay fast on 2 cores
NUM_TEACHERS = 5


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
        manager = GpuManager(cpu_devices(budgets), GpuManagerConfig(**config))  # type: ignore[arg-type]
        made.append(manager)
        return manager

    yield build
    for manager in made:
        manager.check_invariants()
        manager.close()


@pytest.fixture(scope="session")
def teacher_footprint(teacher_folders: list[Path]) -> int:
    """Arena bytes one teacher needs (all teachers share one architecture, so one size)."""
    with GpuManager(cpu_devices([64 << 20])) as manager:
        sizes = {
            manager.register_folder(f"probe{i}", f, "logprobs").footprint_bytes
            for i, f in enumerate(teacher_folders)
        }
    assert len(sizes) == 1
    return sizes.pop()
