"""Host-side emptying of a sandbox's writable places (``CpuManager.empty_dirs``), the
SandboxFusion pool's reset between borrowers: everything below goes, the directories stay,
a planted link is removed and never followed, and what the sandbox user cannot remove is
reported (so the pool retires the sandbox instead of lending it dirty)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from arl_tangram.managers.cpu.manager import CpuManager
from tests.managers.cpu.conftest import SpecMaker, needs_root

pytestmark = needs_root


def _sh(manager: CpuManager, sandbox: str, script: str) -> str:
    r = manager.exec(sandbox, ["sh", "-c", script], timeout_s=30)
    assert r.exit_code == 0, r
    return r.stdout.decode()


def test_everything_below_goes_and_the_directories_stay(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    cwd = spec.cwd
    _sh(manager, any_sandbox, f"mkdir -p {cwd}/a/b /tmp/t && echo x > {cwd}/a/b/f && echo y > {cwd}/.hidden "
                              f"&& echo z > /tmp/t/g && echo w > /dev/shm/s && mkfifo /tmp/fifo")  # fmt: skip
    assert manager.empty_dirs(any_sandbox, (cwd, "/tmp", "/dev/shm", "/not-there")) == []
    listing = _sh(manager, any_sandbox, f"ls -A {cwd} /tmp /dev/shm")
    assert sorted(listing.split()) == sorted([f"{cwd}:", "/dev/shm:", "/tmp:"]), listing


def test_a_planted_link_is_removed_never_followed(manager: CpuManager, sandbox: str) -> None:
    with tempfile.TemporaryDirectory(prefix=f"arl-tangram-{os.getpid()}-victim-") as host_dir:
        victim = os.path.join(host_dir, "victim")
        with open(victim, "w") as f:
            f.write("host data")
        _sh(manager, sandbox, f"ln -s {host_dir} /workspace/dir-link && ln -s {victim} /tmp/file-link && ln -s / /workspace/root")
        assert manager.empty_dirs(sandbox, ("/workspace", "/tmp")) == []
        assert Path(victim).read_text() == "host data"
        assert sorted(_sh(manager, sandbox, "ls -A /workspace /tmp").split()) == ["/tmp:", "/workspace:"]


def test_what_the_sandbox_user_cannot_remove_is_reported(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    cwd = spec.cwd
    _sh(manager, any_sandbox, f"mkdir -p {cwd}/locked/inner && echo x > {cwd}/locked/inner/f && chmod 555 {cwd}/locked/inner")
    left = manager.empty_dirs(any_sandbox, (cwd,))
    assert left and all("locked" in entry for entry in left), left
