"""Shell: make this process a child subreaper and reap the orphans that it adopts.

Orphans of the sandboxes (e.g. an action's process whose launcher died) are reparented to
the nearest subreaper, i.e. us, instead of leaking to the host's init. They must be reaped
without stealing the exit status of children that ``subprocess`` still tracks, so only
zombies from inside the sandboxes' pid namespaces are reaped, by pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import threading

PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)


def become_subreaper() -> bool:
    """Mark the calling process a child subreaper; False when the kernel refuses."""
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _children() -> set[int]:
    pids: set[int] = set()
    me = os.getpid()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{me}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{me}/task/{tid}/children", encoding="ascii") as f:
                pids.update(int(p) for p in f.read().split())
    return pids


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


_owned: set[int] = set()
_owned_lock = threading.Lock()


def spawn(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` whose pid the reaper leaves alone until ``release`` is called."""
    with _owned_lock:  # held across the fork so the reaper cannot see an untracked zombie
        proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        _owned.add(proc.pid)
    return proc


def release(proc: subprocess.Popen[bytes]) -> None:
    """Forget a process from ``spawn`` once its status has been collected."""
    if proc.returncode is not None:
        with _owned_lock:
            _owned.discard(proc.pid)


def reap_orphans() -> int:
    """Reap zombie children adopted from the sandboxes and return how many.

    Adopted orphans are told apart from this process's own children by their pid namespace:
    they live in a sandbox's nested namespace (``NSpid`` deeper than ours), while every
    process the manager (or anything else in this process) spawns directly does not. A pid
    namespace's init cannot finish exiting until such zombies are reaped.
    """
    reaped = 0
    own_depth = _ns_depth(os.getpid())
    for pid in sorted(_children()):
        if not _is_zombie(pid) or _ns_depth(pid) <= own_depth:
            continue
        with _owned_lock:
            if pid in _owned:
                continue
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped += 1
    return reaped


def _ns_depth(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        pass
    return 0


class Reaper:
    """Background thread reaping orphans every ``interval_s``; owned by the manager and
    stopped (joined) by ``close``."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="arl-tangram-cpu-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            reap_orphans()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        reap_orphans()
