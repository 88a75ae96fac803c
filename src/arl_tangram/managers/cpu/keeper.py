"""Shell: crash safety of the CPU manager: sandboxes die with their manager, and a new
manager sweeps what dead managers left.

Two mechanisms, both needed:
  * the keeper: a small process each manager starts, holding the read end of a pipe whose
    write end only the manager has. When the manager dies (even by ``kill -9``) the pipe
    reaches EOF and the keeper kills every task in the manager's cgroups and removes them.
    It does not rely on ``PR_SET_PDEATHSIG``, which fires when the *thread* that forked
    dies (the controller's worker threads come and go).
  * the sweep at start: every manager holds ``flock`` on ``LOCK_DIR/<root>.lock`` for its
    life (the keeper inherits it, so a root is "owned" until its keeper finishes). A root
    group whose lock can be taken, or (older managers) whose pid is gone, belongs to a dead
    manager: its tasks are killed and its groups removed. A live manager's root is never
    touched.
The mount namespaces of killed sandboxes die with their last process.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable

from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver

log = logging.getLogger(__name__)

LOCK_DIR = "/run/arl-tangram"
_ROOT_RE = re.compile(r"arl-tangram-(\d+)-[0-9a-f]+")


def lock_path(root_name: str) -> str:
    return os.path.join(LOCK_DIR, f"{root_name}.lock")


def sweep_root(driver: CgroupDriver) -> list[str]:
    """Kill every task under ``driver``'s root (nothing spared) and remove its groups;
    returns what could not be cleaned."""
    problems: list[str] = []
    for group in driver.list_sandboxes():
        left = driver.kill_sandbox(group, spare_host=False)
        if left:
            problems.append(f"{group}: {left} tasks survived")
        try:
            driver.remove_sandbox(group)
        except OSError as exc:
            problems.append(f"{group}: {exc}")
    try:
        driver.remove_root()
    except OSError as exc:
        problems.append(f"root {driver.root_name}: {exc}")
    return problems


def _owner_dead(root_name: str) -> bool:
    """True when no live manager owns ``root_name`` (its lock is free, or it has no lock
    file and its pid is gone). Takes and keeps nothing."""
    try:
        fd = os.open(lock_path(root_name), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        match = _ROOT_RE.fullmatch(root_name)
        return match is not None and not os.path.exists(f"/proc/{match.group(1)}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases the probe lock too
    return True


def sweep_dead(own: CgroupDriver, make_driver: Callable[[str], CgroupDriver]) -> list[str]:
    """Sweep the root groups of dead managers beside ``own``; returns the roots swept."""
    swept = []
    for name in own.sibling_roots():
        if name == own.root_name or not _ROOT_RE.fullmatch(name) or not _owner_dead(name):
            continue
        problems = sweep_root(make_driver(name))
        if problems:
            log.warning("sweep of dead manager %s incomplete: %s", name, "; ".join(problems))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path(name))
        swept.append(name)
    return swept


class Keeper:
    """The lock and the keeper process of one manager. ``start`` before the root group is
    created; ``close`` after it is removed (the keeper then finds nothing and exits)."""

    def __init__(self, root_name: str, cgroup_parent: str | None) -> None:
        self.root_name = root_name
        self._cgroup_parent = cgroup_parent
        self._lock_fd = -1
        self._pipe_w = -1
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        self._lock_fd = os.open(lock_path(self.root_name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        r, self._pipe_w = os.pipe2(os.O_CLOEXEC)
        try:
            argv = [sys.executable, "-m", "arl_tangram.managers.cpu.keeper_main", self.root_name, self._cgroup_parent or ""]
            # own session: a Ctrl-C or SIGTERM to the embedding app's group must not stop it
            self._proc = subprocess.Popen(argv, stdin=r, pass_fds=(self._lock_fd,), start_new_session=True,
                                          stdout=subprocess.DEVNULL, env={**os.environ, "ARL_TANGRAM_KEEPER": "1"})  # fmt: skip
        finally:
            os.close(r)

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else -1

    def close(self) -> None:
        """Release the lock file and let the keeper exit (it sweeps an already empty root)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path(self.root_name))
        for fd in (self._pipe_w, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._pipe_w = self._lock_fd = -1
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
