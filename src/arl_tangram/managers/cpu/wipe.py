"""Shell: empty a sandbox's writable directories from the host side, with no program run.

Who calls: ``CpuManager.empty_dirs``, for the SandboxFusion pool's reset between calls
(``api/compat/pool.py``). It used to run ``find ... -delete`` in the sandbox: one more
program launch per call, whose launcher joins six cgroups. Under verl's load (issue 26,
768 runs at once) those joins queue on the kernel's global cgroup lock: launchers were seen
by the hundred in ``cgroup_kn_lock_live``, and short programs timed out before they started.
Deleting a few files from the host side costs no launch, no cgroup write and no CPU grant.

Safety against a hostile sandbox, the same two rules as ``files``: every path is walked one
component at a time from the sandbox's root fd (``Sandbox.open_root``, pidfd-checked) with
``O_NOFOLLOW``, so a planted symlink is removed, never followed; and the thread runs with
the sandbox user's fsuid/fsgid, so it can remove only what that user could (as ``find``
in the sandbox could). A directory with more than ``max_entries`` entries in all, or one
that cannot be emptied (made unwritable, a mount point, gone), leaves the sandbox unclean:
the caller then retires it rather than spend the server's time on it. When this runs no
program of the sandbox runs (the pool holds it, every process an action started is gone),
so nothing in the sandbox races the walk.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from arl_tangram.managers.cpu.files import as_sandbox_user, walk_dir
from arl_tangram.managers.cpu.launch import SandboxLayout

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_ENTRIES = 10_000  # assumption: a code run leaves a handful of files; beyond this, retiring the sandbox is cheaper


class Unclean(Exception):
    """What could not be emptied (the message names it)."""


def empty_dirs(root_fd: int, layout: SandboxLayout, paths: Sequence[str], max_entries: int = MAX_ENTRIES) -> tuple[bool, str]:
    """Remove everything below each absolute ``paths`` entry (the directories stay);
    (clean, why not). Never raises for what the sandbox left: it is reported as unclean."""
    budget = [max_entries, max_entries]  # left, cap
    try:
        with as_sandbox_user(layout):
            for path in paths:
                with walk_dir(f"/proc/self/fd/{root_fd}", tuple(p for p in path.split("/") if p), False) as at:
                    dfd = os.open(".", _DIR_FLAGS, dir_fd=at)  # readable: ``walk_dir`` gives an O_PATH fd
                    try:
                        _empty(dfd, path, budget)
                    finally:
                        os.close(dfd)
    except (OSError, Unclean) as exc:
        return False, str(exc)
    return True, ""


def _empty(dfd: int, where: str, budget: list[int]) -> None:
    with os.scandir(dfd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    budget[0] -= len(entries)
    if budget[0] < 0:
        raise Unclean(f"more than {budget[1]} entries to remove (at {where})")
    for name, is_dir in entries:
        if is_dir:
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            try:
                _empty(sub, f"{where}/{name}", budget)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=dfd)
        else:
            os.unlink(name, dir_fd=dfd)
