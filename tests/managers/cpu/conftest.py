"""Fixtures of the CPU manager tests: one real manager per module (cgroups v1 on this host)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.rootfs import ImageRoot
from tests.managers.cpu.image_tree import build_base


def host_can_sandbox() -> bool:
    return os.geteuid() == 0 and shutil.which("bwrap") is not None


# Skipped only on a developer's machine without root or bubblewrap; under CI (CI=true) the
# sandbox tests always run, so a missing bubblewrap fails the build instead of hiding it.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
needs_root = pytest.mark.skipif(not host_can_sandbox() and not IN_CI, reason="needs root and bubblewrap")

SMALL = SandboxSpec(mem_bytes=256 << 20, pids_max=128, workspace_bytes=64 << 20, tmp_bytes=32 << 20)


@pytest.fixture(scope="module")
def manager() -> Iterator[CpuManager]:
    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
    mgr = CpuManager(CpuManagerConfig(default_spec=SMALL))
    yield mgr
    root = mgr.root_name
    mgr.close()
    assert not glob.glob(f"/sys/fs/cgroup/**/{root}", recursive=True), "manager left cgroups behind"


@pytest.fixture
def sandbox(manager: CpuManager) -> Iterator[str]:
    sid = manager.create_sandbox()
    yield sid
    manager.destroy_sandbox(sid)


@pytest.fixture(scope="session")
def image_dir() -> Iterator[Path]:
    """A tiny image layer built from host files (see ``image_tree``), removed at the end."""
    top = Path(tempfile.mkdtemp(prefix=f"arl-tangram-{os.getpid()}-img-"))
    try:
        yield build_base(top / "base")
    finally:
        shutil.rmtree(top)


def image_root(layer: Path, **overrides: object) -> ImageRoot:
    fields: dict[str, object] = {"lower_dirs": (layer,), "env": (("IMAGE_VAR", "from-image"),), "working_dir": "/testbed",
                                 "writable_bytes": 64 << 20, **overrides}  # fmt: skip
    return ImageRoot(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SpecMaker:
    """Builds sandbox specs on one kind of root; the escape suites run on both kinds."""

    image: Path | None  # the image layer, or None for the host root
    above: tuple[Path, ...] = ()  # snapshot layers over the image (a forked env's root)

    def __call__(self, **overrides: int) -> SandboxSpec:
        base = {"mem_bytes": SMALL.mem_bytes, "pids_max": SMALL.pids_max, "workspace_bytes": SMALL.workspace_bytes,
                "tmp_bytes": SMALL.tmp_bytes, **overrides}  # fmt: skip
        root = image_root(self.image, lower_dirs=(self.image, *self.above)) if self.image is not None else None
        return SandboxSpec(**base, root=root)

    @property
    def cwd(self) -> str:
        return "/testbed" if self.image is not None else "/workspace"

    @property
    def uid(self) -> str:
        return "0" if self.image is not None else "1000"


@pytest.fixture(params=["host", "image"])
def spec(request: pytest.FixtureRequest, image_dir: Path) -> SpecMaker:
    """Parametrizes a test over the host root and an image root."""
    return SpecMaker(image_dir if request.param == "image" else None)


@pytest.fixture
def any_sandbox(manager: CpuManager, spec: SpecMaker) -> Iterator[str]:
    """A sandbox on the root ``spec`` names (host, then image)."""
    sid = manager.create_sandbox(spec())
    yield sid
    manager.destroy_sandbox(sid)
