"""Integrated image tests' kit: a SWE-style test image made from host files (a python3 base
from ``image_tree`` plus a task layer: a git-less repo at /testbed with a failing test),
pushed with skopeo to a real docker-registry on 127.0.0.1, and configs whose ``[images]``
store pulls from it. Built once per test session; the registry is stopped by PID after."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from arl_tangram.runtime.config import TangramConfig
from arl_tangram.runtime.config_images import ImagesConfig, RegistryConfig
from tests.managers.cpu.image_tree import build_base
from tests.managers.images.builders import write_oci_layout
from tests.managers.images.registry_fixture import Registry

CALC = "def add(a, b):\n    return a - b\n"
TEST = "import calc\nassert calc.add(2, 3) == 5, 'add is wrong'\nprint('ok')\n"
#: the patch a SWE task applies: ``add`` fixed
FIXED = "def add(a, b):\n    return a + b\n"
IMAGE_CONFIG = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "TASK=calc"], "WorkingDir": "/testbed"}


def tar_tree(root: Path) -> bytes:
    """A layer tar of ``root`` owned by image root (the tree on disk is shifted)."""
    cmd = ["tar", "-C", str(root), "--numeric-owner", "--owner=0", "--group=0", "--sort=name", "-cf", "-", "."]
    return subprocess.run(cmd, capture_output=True, check=True).stdout


def task_tree(root: Path) -> Path:
    (root / "testbed").mkdir(parents=True)
    (root / "testbed/calc.py").write_text(CALC)
    (root / "testbed/test_calc.py").write_text(TEST)
    return root


@dataclass(frozen=True)
class ImageKit:
    registry: Registry
    reference: str  # the SWE-style image at the loopback registry
    layout: Path  # its OCI layout on disk (for imports)
    work: Path

    @property
    def shared_store(self) -> Path:
        """A store the session's tests reuse one after another (never two runtimes at once):
        tests that do not need a cold node pull the image once."""
        return self.work / "shared-store"

    def config(self, store: Path, *, password_env: str | None = None, username: str | None = None,
               **images: object) -> TangramConfig:
        reg = RegistryConfig(host=self.registry.host, username=username, password_env=password_env, insecure=True)
        return TangramConfig(images=ImagesConfig(store_path=str(store), registries=(reg,), **images))  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def image_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageKit]:
    if os.geteuid() != 0:
        pytest.skip("needs root (overlay mounts, shifted owners)")
    work = tmp_path_factory.mktemp("image-kit")
    layers = [tar_tree(build_base(work / "base")), tar_tree(task_tree(work / "task"))]
    write_oci_layout(work / "oci", layers, tag="v1", config=IMAGE_CONFIG)
    registry = Registry(work / "registry")
    try:
        reference = registry.push(work / "oci", "swe/calc", "v1")
        yield ImageKit(registry, reference, work / "oci", work)
    finally:
        registry.stop()
