"""Shell: learning that a sandbox is stuck at its memory limit (pause-and-grow, issue 21).

One watch per running action that has a memory grant. v1: ``memory.oom_control`` with
``oom_kill_disable 1`` parks the tasks in the kernel at the limit instead of killing them,
and an eventfd registered on ``cgroup.event_control`` fires when that happens. v2:
``memory.high`` throttles (reclaim, then sleep) over the grant while ``memory.max`` stays the
env's limit; ``memory.events`` is pollable (``POLLPRI``) and its ``high`` count rises.
Both give a pollable fd and ``consume()``: whether the sandbox is stuck now.
"""

from __future__ import annotations

import contextlib
import os
import select
from typing import Protocol

from arl_tangram.managers.cpu.cgroup_fs import read_keyed, write_text


class MemoryWatch(Protocol):
    def fileno(self) -> int: ...

    def consume(self) -> bool:
        """Clear the pending notification; True when the sandbox is at its limit now."""
        ...

    def close(self) -> None: ...


class V1OomWatch:
    """An eventfd on ``memory_dir``'s ``memory.oom_control`` (v1)."""

    def __init__(self, memory_dir: str) -> None:
        self._control = os.path.join(memory_dir, "memory.oom_control")
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._cfd = os.open(self._control, os.O_RDONLY | os.O_CLOEXEC)
        try:
            write_text(os.path.join(memory_dir, "cgroup.event_control"), f"{self._efd} {self._cfd}")
        except OSError:
            self.close()
            raise

    def fileno(self) -> int:
        return self._efd

    def consume(self) -> bool:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        return read_keyed(self._control).get("under_oom", 0) == 1

    def close(self) -> None:
        for fd in (self._efd, self._cfd):
            with contextlib.suppress(OSError):
                os.close(fd)


class V2HighWatch:
    """``memory.events`` of ``group_dir`` polled for ``POLLPRI`` (v2): stuck when its
    ``high`` count rose since the last look."""

    def __init__(self, group_dir: str) -> None:
        self._events = os.path.join(group_dir, "memory.events")
        self._fd = os.open(self._events, os.O_RDONLY | os.O_CLOEXEC)
        self._high = read_keyed(self._events).get("high", 0)

    def fileno(self) -> int:
        return self._fd

    def consume(self) -> bool:
        with contextlib.suppress(OSError):
            os.pread(self._fd, 4096, 0)  # re-arms the notification
        high = read_keyed(self._events).get("high", 0)
        rose, self._high = high > self._high, high
        return rose

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def wait_fired(watch: MemoryWatch, timeout_s: float) -> bool:
    """Whether the watch's fd signals within ``timeout_s`` (eventfd: readable; v2: PRI)."""
    poller = select.poll()
    poller.register(watch.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))
