"""Shell: pause-and-grow for one running action (issue 21): its memory grant armed on the
env's cgroup, the watch that learns it is over it, and the pause clock.

Who calls: ``CpuManager.exec`` opens one per action run with a memory grant and a pause
callback and hands it to the run's pump, which serves its watch (``run_watch``);
``grow`` / ``oom_kill`` / ``retarget`` come from the controller's decisions (other threads),
and ``close`` ends it when the action ends.

The grant is soft (``memory_watch``): the env's hard limit stays its own, so no charge fails
under it (a ``write()`` into a tmpfs included), and over the grant the action's tasks are
held (v1: frozen; v2: throttled by ``memory.high``). ``on_paused(usage_bytes)`` is called
once per pause, from the pump thread, and the caller reports it to the core, which answers
``grow`` (re-armed at the new grant; the pause ends, or at once begins again when usage
already passed the new grant too) or ``oom_kill`` (the grant becomes a hard limit with the
kernel's OOM killer on: outcome ``oom_killed``). Paused time is measured here: it is queue
time, and it pushes the action's timeout back (``paused_s``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable

from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.memory_watch import ARMING_POLL_S, MemoryWatch
from arl_tangram.managers.cpu.run_watch import Waker

log = logging.getLogger(__name__)
LOCK_STRIPES = 64  # sandboxes whose open and close may run at once on a node (hash collisions aside)


class MemoryPause:
    """One action's armed grant (a ``run_watch.RunWatcher``: the action's pump thread serves
    its watch; it has no thread of its own)."""

    def __init__(
        self, driver: CgroupDriver, group: str, limit_bytes: int, ceiling_bytes: int, on_paused: Callable[[int], None]
    ) -> None:  # fmt: skip
        self._driver, self._group, self._on_paused = driver, group, on_paused
        self._ceiling = ceiling_bytes
        self._lock = threading.Lock()
        self._since: float | None = None
        self._total_s = 0.0
        self._killed = False  # the kernel's OOM killer decides from now on
        self._closed = False
        self._gone = False  # the group went away under a destroy: nothing more to watch
        # re-arms from other threads poke it: the pump then watches the new watch's fd
        self._waker = Waker()
        self._watch: MemoryWatch | None = driver.open_memory_watch(group, limit_bytes, ceiling_bytes)

    # -- served by the action's pump thread (``run_watch``) -------------------------------
    def watched_fds(self) -> tuple[int, ...]:
        with self._lock:
            if self._closed:
                return ()
            watching = self._watch is not None and not (self._killed or self._gone)
            return (self._waker.fd, self._watch.fileno()) if watching else (self._waker.fd,)  # type: ignore[union-attr]

    def serve(self, now: float, ready: frozenset[int]) -> float | None:
        with self._lock:
            self._waker.drain()
            watch = self._watch
            if watch is None or self._closed or self._killed or self._gone:
                return None
            fired = watch.fileno() in ready
            # A fresh grant may already be passed, which no crossing signals. Until a v1
            # threshold is registered (``memory_watch``) the pump reads the usage every
            # ``ARMING_POLL_S``, its first look at the run's start, and the registration
            # signals once when done (v2: the kernel counts a throttle over ``memory.high``).
            # Later only a crossing (the watch's fd) or a re-arm (the waker) wakes it.
            polling = not watch.armed()
            if not (fired or polling):
                return None
        try:
            usage = self._check(watch)
        except OSError:  # the sandbox went away under a destroy: its run is ending
            log.debug("memory watch of %s: group gone", self._group, exc_info=True)
            with self._lock:
                self._gone = True
            return None
        if usage is not None:
            with contextlib.suppress(OSError):
                self._on_paused(usage)
            return None
        return now + ARMING_POLL_S if polling else None

    def _check(self, watch: MemoryWatch) -> int | None:
        """The usage to report when a pause begins now, else None."""
        with self._lock:
            if watch is not self._watch or self._killed or self._closed:
                return None
            if not watch.consume() or self._since is not None:
                return None
            began = time.monotonic()  # the pause runs from the crossing, freezing included
            usage = watch.stop_for_grant()
            if usage is None:
                # it was cache, reclaimed: the kernel may have missed that downward crossing
                # (its threshold checks are rate-limited) and then never signal the next
                # upward one; a fresh registration starts from the usage now
                return self._rearm(watch.grant_bytes, paused=False)
            self._since = began
            return usage

    def _resume(self) -> None:
        if self._since is not None:
            self._total_s += time.monotonic() - self._since
            self._since = None

    def _rearm(self, limit_bytes: int, paused: bool) -> int | None:
        """Arm ``limit_bytes`` in place of the current grant (lock held). A run still paused
        stays held; else it is held again when usage already passed the new grant (no
        crossing will fire): then its usage is returned, to report a new pause."""
        new = self._driver.open_memory_watch(self._group, limit_bytes, self._ceiling)
        old, self._watch = self._watch, new
        self._waker.poke()  # the pump watches the old watch's fd: have it take the new one
        if old is not None:
            old.close()  # what it held stays held until the new watch decides
        if new is None:
            return None
        if paused:
            new.hold()
            return None
        began = time.monotonic()
        usage = new.stop_for_grant() if new.consume() else None
        if usage is None:
            new.release()
        else:
            self._since = began
        return usage

    def grow(self, limit_bytes: int) -> None:
        """The core grew the grant: re-arm at ``limit_bytes`` and end the pause (a new one
        is reported at once when usage already passed the new grant too)."""
        with self._lock:
            if self._killed:
                return
            self._resume()
            usage = self._rearm(limit_bytes, paused=False)
        if usage is not None:
            with contextlib.suppress(OSError):
                self._on_paused(usage)

    def retarget(self, limit_bytes: int) -> None:
        """A sibling run started: the env's grants moved; a pause goes on waiting for the
        core's answer."""
        with self._lock:
            if self._killed:
                return
            usage = self._rearm(limit_bytes, paused=self._since is not None)
        if usage is not None:
            with contextlib.suppress(OSError):
                self._on_paused(usage)

    def oom_kill(self) -> None:
        """Let the kernel's OOM killer end what is over the grant."""
        with self._lock:
            self._killed = True
            if self._watch is not None:
                self._watch.end_as_oom()
            self._resume()
            self._waker.poke()  # the pump stops watching

    def paused_s(self) -> float:
        """Paused time so far (seconds), the current pause included."""
        with self._lock:
            ongoing = time.monotonic() - self._since if self._since is not None else 0.0
            return self._total_s + ongoing

    def close(self, ceiling_bytes: int) -> float:
        """Stop watching, release what is held, give the env its own limit back (its idle
        footprint is measured against it) with the kernel's OOM killer on; returns the
        paused time. Called once the action's pump has returned."""
        with self._lock:
            self._closed = True
            self._waker.close()
            if self._watch is not None:
                with contextlib.suppress(OSError):
                    self._watch.release()
                self._watch.close()
            self._resume()
        with contextlib.suppress(OSError):
            self._driver.set_memory_pause(self._group, False)
            self._driver.set_memory_limit(self._group, ceiling_bytes)
        return self._total_s


class MemoryPauses:
    """The open ``MemoryPause`` of each sandbox (one at a time: concurrent actions of one
    env share its cgroup, so the first one's watch reports for the env and a later one only
    moves its grant to what the core computed for all of them).

    Locking: the cgroup writes of an ``open`` or ``close`` are slow (milliseconds under
    load), so they run under a lock of the sandbox's stripe, not
    under one lock for the node: with a single lock, every action's start and end on the
    node queued behind them (issue 26: 200 runs in flight spent more time waiting for it
    than running). ``_lock`` only guards the table itself."""

    def __init__(self, driver: CgroupDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._stripes = tuple(threading.Lock() for _ in range(LOCK_STRIPES))
        self._open: dict[str, MemoryPause] = {}

    def _stripe(self, sandbox_id: str) -> threading.Lock:
        return self._stripes[hash(sandbox_id) % LOCK_STRIPES]

    def _get(self, sandbox_id: str) -> MemoryPause | None:
        with self._lock:
            return self._open.get(sandbox_id)

    def open(
        self, sandbox_id: str, group: str, limit_bytes: int, ceiling_bytes: int, on_paused: Callable[[int], None] | None
    ) -> MemoryPause | None:  # fmt: skip
        """Apply ``limit_bytes`` for an action's life: with ``on_paused``, softly (pause
        over it); else as a hard limit (the kernel OOM-kills over it: pause-and-grow off)."""
        with self._stripe(sandbox_id):
            pause = self._get(sandbox_id)
            if pause is not None:
                pause.retarget(limit_bytes)
                return None
            if on_paused is None:
                self._driver.set_memory_limit(group, limit_bytes)
                return None
            pause = MemoryPause(self._driver, group, limit_bytes, ceiling_bytes, on_paused)
            with self._lock:
                self._open[sandbox_id] = pause
            return pause

    def grow(self, sandbox_id: str, limit_bytes: int) -> bool:
        pause = self._get(sandbox_id)
        if pause is not None:
            pause.grow(limit_bytes)
        return pause is not None

    def oom_kill(self, sandbox_id: str) -> bool:
        pause = self._get(sandbox_id)
        if pause is not None:
            pause.oom_kill()
        return pause is not None

    def restore(self, sandbox_id: str, group: str, ceiling_bytes: int) -> None:
        """After a run that had no watch of its own: the env's own limit again, unless
        another run's watch is open (it restores when it closes)."""
        with self._stripe(sandbox_id):
            if self._get(sandbox_id) is None:
                with contextlib.suppress(OSError):
                    self._driver.set_memory_limit(group, ceiling_bytes)

    def close(self, sandbox_id: str, pause: MemoryPause, ceiling_bytes: int) -> float:
        # under the stripe: a sibling's ``open`` waits, so it never arms its limit before
        # this close puts the env's own limit back over it
        with self._stripe(sandbox_id):
            with self._lock:
                if self._open.get(sandbox_id) is pause:
                    del self._open[sandbox_id]
            return pause.close(ceiling_bytes)
