"""The host-side reset of a sandbox's writable directories (``CpuManager.empty_dirs``, the
SandboxFusion pool's reset): it empties them without running a program, never follows a
link the sandbox planted, and reports (does not hide) what it could not remove."""

from __future__ import annotations

import os

from arl_tangram.managers.cpu import wipe
from arl_tangram.managers.cpu.manager import CpuManager

DIRS = ("/workspace", "/tmp", "/dev/shm")
LIST = "find /workspace /tmp /dev/shm -mindepth 1 | sort"


def test_it_empties_the_writable_directories_without_a_program(manager: CpuManager, sandbox: str) -> None:
    fill = "mkdir -p /workspace/a/b && echo x > /workspace/a/b/f && echo y > /tmp/t && echo z > /dev/shm/s && ln -s /etc /workspace/l"
    assert manager.exec(sandbox, fill, timeout_s=20).exit_code == 0
    launched: list[object] = []
    real_run = manager.exec
    manager.exec = lambda *a, **k: launched.append(a) or real_run(*a, **k)  # type: ignore[method-assign]
    try:
        assert manager.empty_dirs(sandbox, DIRS) == (True, "")
    finally:
        del manager.exec
    assert launched == []
    assert manager.exec(sandbox, LIST, timeout_s=20).stdout_text == ""
    assert manager.exec(sandbox, "ls -d /workspace /tmp /dev/shm", timeout_s=20).exit_code == 0  # the directories stay


def test_a_planted_symlink_is_removed_never_followed(manager: CpuManager, sandbox: str) -> None:
    """Links into a directory that is not emptied: following one would delete its files."""
    plant = "mkdir -p /tmp/keep && echo x > /tmp/keep/f && ln -s /tmp/keep /workspace/link && ln -s ../tmp/keep /workspace/rel"
    assert manager.exec(sandbox, plant, timeout_s=20).exit_code == 0
    assert manager.empty_dirs(sandbox, ("/workspace",)) == (True, "")
    r = manager.exec(sandbox, "ls -A /workspace; cat /tmp/keep/f", timeout_s=20)
    assert r.stdout_text == "x\n", r.stdout_text  # the links are gone, what they pointed at is not


def test_what_the_sandbox_user_cannot_remove_leaves_it_unclean(manager: CpuManager, sandbox: str) -> None:
    lock = "mkdir -p /workspace/locked/inner && echo x > /workspace/locked/inner/f && chmod 555 /workspace/locked/inner"
    assert manager.exec(sandbox, lock, timeout_s=20).exit_code == 0
    clean, why = manager.empty_dirs(sandbox, DIRS)
    assert not clean and "Permission denied" in why, why
    assert manager.exec(sandbox, "chmod 755 /workspace/locked/inner", timeout_s=20).exit_code == 0
    assert manager.empty_dirs(sandbox, DIRS) == (True, "")


def test_more_entries_than_the_cap_leaves_it_unclean(manager: CpuManager, sandbox: str) -> None:
    assert manager.exec(sandbox, "cd /tmp && touch $(seq 1 50)", timeout_s=20).exit_code == 0
    sb = manager.get_sandbox(sandbox)
    root = sb.open_root()
    try:
        clean, why = wipe.empty_dirs(root, sb.layout, DIRS, max_entries=20)
    finally:
        os.close(root)
    assert not clean and "more than 20 entries" in why, why
    assert manager.empty_dirs(sandbox, DIRS) == (True, "")
