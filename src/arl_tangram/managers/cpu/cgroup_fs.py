"""Shell: the tiny file-level primitives shared by the cgroup drivers (read, write, retry rmdir).

Both drivers talk to cgroupfs only through these helpers, which makes a fake cgroupfs tree
(plain files in a temp dir) a faithful stand-in for unit tests of the v2 driver.
"""

from __future__ import annotations

import errno
import os
import time


def write_text(path: str, value: str) -> None:
    """Write ``value`` with one ``write(2)``, as cgroupfs requires (no buffering; O_TRUNC is a no-op on cgroupfs and keeps fake trees exact)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read_text(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _gone(exc: OSError) -> bool:
    """Whether reading a group's file failed because the group is gone: removed before the
    open (``FileNotFoundError``), or between the open and the read (ENODEV: a destroy racing
    a run's last reads, seen as a session run's error instead of its ``cancelled``)."""
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENODEV


def _read_if_present(path: str) -> str | None:
    """The file's text, or None when its group is gone (``_gone``); other errors raise."""
    try:
        return read_text(path)
    except OSError as exc:
        if _gone(exc):
            return None
        raise


def read_int(path: str, default: int = 0) -> int:
    """The integer in a one-value file; ``default`` when it is missing (its group gone) or empty."""
    text = (_read_if_present(path) or "").strip()
    return int(text) if text and text != "max" else default


def read_keyed(path: str) -> dict[str, int]:
    """A flat-keyed file (``memory.events``, ``memory.oom_control``, ``cpu.stat``) as a dict;
    empty when its group is gone (a destroy racing the read)."""
    out: dict[str, int] = {}
    for line in (_read_if_present(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_pids(path: str) -> list[int]:
    """Pids (or tids) listed in ``cgroup.procs`` / ``tasks``; empty when the group is gone."""
    try:
        return [int(x) for x in (_read_if_present(path) or "").split()]
    except ProcessLookupError:
        return []


def rmdir_retry(path: str, timeout_s: float = 3.0) -> None:
    """Remove a cgroup directory, retrying while exiting tasks still pin it (EBUSY).

    Idempotent: a missing directory is not an error.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
