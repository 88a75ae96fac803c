"""Fixtures of the CPU manager tests: one real manager per module (cgroups v1 on this host)."""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Iterator

import pytest

from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager


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
