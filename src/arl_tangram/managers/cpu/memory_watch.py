"""Shell: enforcing a running action's memory grant softly (pause-and-grow, issue 21).

The grant is never the hard cgroup limit while pause-and-grow is on: at a hard limit cgroup
v1 fails memory a system call charges (``write()`` into a tmpfs, a fork's kernel stack) with
ENOMEM instead of pausing, so an action would die while the node has memory. The grant is a
watched mark under a higher hard limit:

* v1: the hard limit stays the env's (``hard_limit_bytes``) with ``oom_kill_disable 1``: a
  page fault that reaches it waits in the kernel, and the core ends it ``oom_killed``.
  An eventfd on ``cgroup.event_control`` is registered twice: a ``memory.usage_in_bytes``
  threshold at the grant, and ``memory.oom_control``. When usage crosses the grant,
  ``stop_for_grant`` freezes the sandbox's action slots, then tries to push usage back under
  the grant by lowering the hard limit to it for an instant (the kernel reclaims page cache;
  nothing charges while frozen): if that works the usage was cache and the tasks are thawed
  at once; if not (``EBUSY``: anon or tmpfs pages) the action is over its grant and stays
  frozen while the core decides.
* v2: ``memory.high`` at the grant throttles (reclaim, then sleep) and never fails a
  charge; ``memory.max`` stays the env's limit; ``memory.events`` counts it (inotify).
  The kernel holds the tasks itself, so nothing is frozen.

Arming off the run's path (v1): registering a ``memory.usage_in_bytes`` threshold waits an
RCU grace period in the kernel (``synchronize_rcu`` under the memcg's threshold lock): 8-25
ms per run here, measured, the largest part of a short action's overhead (a 50-ms lint paid
it on every run; issue 26). The OOM event registers at once; the threshold is registered on
a small shared pool of threads (``ARMING_WORKERS``) while the program starts, and until it
is (``armed()``) the pump reads the usage every ``ARMING_POLL_S`` instead (``memory_pause``),
then the arming signals the eventfd once, so a crossing before the threshold existed is
seen. The overshoot below grows by nothing beyond that polling period.

Overshoot: the tasks run between the crossing and the freeze (the eventfd is checked every
128 page events per cpu, then this thread must get the GIL), so usage passes the grant by
what they charge meanwhile: the rate times that latency (measured: a 200 MiB tmpfs write
paused 1-17 MiB over a 32 MiB grant), never more than the env's limit. It is charged: the
usage reported with the pause is what the core grows the grant from, and the node's measured
free memory (``node_memory``) shows it until then; the node's reserve (``mem_reserve_bytes``)
absorbs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from arl_tangram.managers.cpu.cgroup_fs import read_int, read_keyed, read_text, write_text

#: Room the v1 hard limit leaves above a grant; None: the env's own limit. Any hard limit
#: a writer reaches before it is frozen fails its write (ENOMEM), and the freeze comes from
#: a Python thread (the eventfd wakes it within microseconds, the GIL may take ~5 ms more):
#: a 16 MiB room was outrun by ``head -c 200M /dev/zero > /tmp/x`` inside the runtime. So
#: the hard limit stays the env's limit, where failing is right; 0 is the previous mechanism
#: (a hard limit at the grant), kept to test what this replaces.
HARD_LIMIT_ROOM_BYTES: int | None = None
FREEZE_WAIT_S = 0.25  # v1 freezing is asynchronous: how long to wait for FROZEN (then: over)
_RECLAIM_RETRIES = 3  # lowering the hard limit to the grant: tries before it counts as over
ARMING_WORKERS = 32  # threshold registrations in flight at once (each mostly waits in the kernel)
ARMING_POLL_S = 0.005  # how often the pump reads the usage while a threshold is being armed
log = logging.getLogger(__name__)


@functools.cache
def _arming_pool() -> ThreadPoolExecutor:
    """The threads that register v1 usage thresholds (module doc: arming off the run's path)."""
    return ThreadPoolExecutor(max_workers=ARMING_WORKERS, thread_name_prefix="memory-arming")


class MemoryWatch(Protocol):
    """One armed grant: made by ``CgroupDriver.open_memory_watch``; re-arming at a new
    grant is closing it and opening another. Called by one ``MemoryPause`` under its lock."""

    grant_bytes: int

    def fileno(self) -> int: ...

    def armed(self) -> bool:
        """Whether a crossing of the grant now signals ``fileno`` (v1: once its threshold is
        registered, module doc); until then the caller polls ``consume``."""
        ...

    def consume(self) -> bool:
        """Clear the pending notification; True when the sandbox may be over its grant now."""
        ...

    def hold(self) -> None:
        """Hold the sandbox's tasks (idempotent; v2: the kernel throttles them already)."""
        ...

    def stop_for_grant(self) -> int | None:
        """Hold the sandbox's tasks and return its usage when it is over its grant, or None
        (tasks released) when it is not after all (it was reclaimable cache)."""
        ...

    def release(self) -> None:
        """Let the held tasks run again (idempotent)."""
        ...

    def end_as_oom(self) -> None:
        """Make the grant a hard limit with the kernel's OOM killer on, and release: what is
        over it is ended as an OOM kill (or, for a write into a tmpfs, fails with ENOMEM)."""
        ...

    def close(self) -> None: ...


class V1GrantWatch:
    """The v1 watch of a grant (see the module docstring). ``slots_dir`` is the sandbox's
    freezer group; every slot under it but ``keep_slot`` (the init) is frozen on a pause."""

    def __init__(self, memory_dir: str, slots_dir: str, keep_slot: str, grant_bytes: int, ceiling_bytes: int) -> None:
        self._dir, self._slots_dir, self._keep = memory_dir, slots_dir, keep_slot
        self.grant_bytes, self._hard = grant_bytes, hard_limit_bytes(grant_bytes, ceiling_bytes)
        self._usage = os.path.join(memory_dir, "memory.usage_in_bytes")
        self._control = os.path.join(memory_dir, "memory.oom_control")
        self._fds: list[int] = []
        self._efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._events = os.path.join(memory_dir, "cgroup.event_control")
        self._lock = threading.Lock()  # guards the fds between the arming thread and ``close``
        self._arming = self._closed = False
        try:
            self._set_limit(self._hard)
            write_text(self._control, "1")
            self._fds.append(os.open(self._control, os.O_RDONLY | os.O_CLOEXEC))
            write_text(self._events, f"{self._efd} {self._fds[-1]}")
        except OSError:
            self.close()
            raise
        if grant_bytes < self._hard:  # at the env's limit only the OOM event counts
            self._arming = True
            try:
                _arming_pool().submit(self._arm_threshold)
            except RuntimeError:  # the interpreter is shutting down: no new threads, arm here
                self._arm_threshold()

    def _arm_threshold(self) -> None:
        """On the arming pool: register the usage threshold at the grant, then signal the
        eventfd once (a crossing before it existed fired nothing; ``consume`` reads the
        usage). Closes the fds itself when ``close`` came meanwhile."""
        fd = -1
        try:
            fd = os.open(self._usage, os.O_RDONLY | os.O_CLOEXEC)
            write_text(self._events, f"{self._efd} {fd} {self.grant_bytes}")
        except OSError:  # the group went away under a destroy: its run is ending
            log.debug("memory threshold of %s: not armed", self._dir, exc_info=True)
        with self._lock:
            self._arming = False
            if fd >= 0:
                self._fds.append(fd)
            if self._closed:
                self._close_fds()
            else:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_write(self._efd, 1)

    def fileno(self) -> int:
        return self._efd

    def armed(self) -> bool:
        with self._lock:
            return not self._arming

    def usage_bytes(self) -> int:
        return read_int(self._usage)

    def consume(self) -> bool:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        # a threshold fires on crossings both ways: only being over it counts
        return self.usage_bytes() >= self.grant_bytes or self._under_oom()

    def stop_for_grant(self) -> int | None:
        self.hold()
        # at the hard limit a faulting task waits in the kernel (it does not freeze there):
        # over the grant for sure, and nothing to reclaim
        if not self._under_oom() and self._wait_frozen() and self._reclaim_to_grant():
            self.release()
            return None
        return self.usage_bytes()

    def _under_oom(self) -> bool:
        return read_keyed(self._control).get("under_oom", 0) == 1

    def _slots(self) -> list[str]:
        try:
            return [e.path for e in os.scandir(self._slots_dir) if e.is_dir() and e.name != self._keep]
        except FileNotFoundError:
            return []

    def _set_slots(self, state: str) -> None:
        for path in self._slots():
            with contextlib.suppress(FileNotFoundError):
                write_text(os.path.join(path, "freezer.state"), state)

    def hold(self) -> None:
        self._set_slots("FROZEN")

    def _wait_frozen(self) -> bool:
        deadline = time.monotonic() + FREEZE_WAIT_S
        while True:
            states = []
            for path in self._slots():
                with contextlib.suppress(FileNotFoundError):
                    states.append(read_text(os.path.join(path, "freezer.state")).strip())
            if all(s == "FROZEN" for s in states):
                return True
            if time.monotonic() > deadline or self._under_oom():
                return False
            time.sleep(0.002)

    def _reclaim_to_grant(self) -> bool:
        """Whether the kernel could bring usage under the grant (then the hard limit is the
        env's again). Only while every task is frozen: at a hard limit a charge fails."""
        ok = False
        for _ in range(_RECLAIM_RETRIES):
            try:
                self._set_limit(self.grant_bytes)
                ok = True
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
        self._set_limit(self._hard)
        return ok

    def _set_limit(self, limit_bytes: int) -> None:
        write_text(os.path.join(self._dir, "memory.limit_in_bytes"), str(limit_bytes))

    def release(self) -> None:
        self._set_slots("THAWED")

    def end_as_oom(self) -> None:
        # at least its usage now (v1 refuses a limit under usage it cannot reclaim)
        for limit in (self.grant_bytes, self.usage_bytes() + (1 << 20)):
            try:
                self._set_limit(min(limit, self._hard))
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
        write_text(self._control, "0")
        self.release()

    def close(self) -> None:
        """Unregister (closing the eventfd does; while the threshold is still being armed,
        the arming thread does it when done); what is held and the limit are the caller's
        (a re-armed watch holds on where this one stops)."""
        with self._lock:
            self._closed = True
            if not self._arming:
                self._close_fds()

    def _close_fds(self) -> None:
        for fd in (self._efd, *self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        self._efd = -1


class V2HighWatch:
    """``memory.high`` of ``group_dir`` at the grant; an inotify watch on ``memory.events``
    (the kernel reports each change of that file as a modification): over its grant when
    the ``high`` count rose since the last look. inotify, not ``POLLPRI`` on the file, because
    the file is always readable to a selector: the pump would spin on it."""

    def __init__(self, group_dir: str, grant_bytes: int, ceiling_bytes: int) -> None:
        self._dir, self.grant_bytes, self._ceiling = group_dir, grant_bytes, ceiling_bytes
        write_text(os.path.join(group_dir, "memory.high"), str(grant_bytes))
        self._events = os.path.join(group_dir, "memory.events")
        self._fd = inotify_modified(self._events)
        self._high = read_keyed(self._events).get("high", 0)
        self._lowered = False

    def fileno(self) -> int:
        return self._fd

    def armed(self) -> bool:
        return True  # ``memory.high`` throttles from its write on

    def consume(self) -> bool:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._fd, 4096):  # the queued change events
                pass
        high = read_keyed(self._events).get("high", 0)
        rose, self._high = high > self._high, high
        return rose

    def hold(self) -> None:
        """Nothing is frozen on v2: ``memory.high`` throttles (raising it ends that)."""

    def stop_for_grant(self) -> int | None:
        return read_int(os.path.join(self._dir, "memory.current"))

    def release(self) -> None:
        """As ``hold``: nothing to do."""

    def end_as_oom(self) -> None:
        write_text(os.path.join(self._dir, "memory.max"), str(self.grant_bytes))
        self._lowered = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if self._lowered:  # the env's own limit again after an OOM kill
            with contextlib.suppress(OSError):
                write_text(os.path.join(self._dir, "memory.max"), str(self._ceiling))


_IN_MODIFY, _IN_NONBLOCK, _IN_CLOEXEC = 0x2, os.O_NONBLOCK, os.O_CLOEXEC


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # once: a v2 watch is opened on every run


def inotify_modified(path: str) -> int:
    """A non-blocking inotify fd that becomes readable when ``path`` is modified."""
    libc = _libc()
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    if libc.inotify_add_watch(fd, os.fsencode(path), _IN_MODIFY) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"inotify_add_watch {path}")
    return fd


def hard_limit_bytes(grant_bytes: int, ceiling_bytes: int) -> int:
    """The v1 hard limit under which ``grant_bytes`` is watched (``HARD_LIMIT_ROOM_BYTES``)."""
    room = HARD_LIMIT_ROOM_BYTES
    return ceiling_bytes if room is None else min(ceiling_bytes, grant_bytes + room)
