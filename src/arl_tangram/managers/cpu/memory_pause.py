"""Shell: pause-and-grow for one running action (issue 21): its memory grant on the env's
cgroup, the watch that learns it is stuck at that limit, and the pause clock.

Who calls: ``CpuManager.exec`` opens one per action run with a memory grant and a pause
callback, ``grow`` / ``oom_kill`` come from the controller's decisions (other threads), and
``close`` ends it when the action ends. Over its grant the action's tasks wait in the kernel
(v1 ``oom_kill_disable``; v2 ``memory.high`` throttles): ``on_paused(usage_bytes)`` is
called once per pause, from the watch thread, and the caller reports it to the core, which
answers ``grow`` (the pause ends) or ``oom_kill`` (the kernel's OOM killer ends the action:
outcome ``oom_killed``). Paused time is measured here: it is queue time, and it pushes the
action's timeout back (``paused_s``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.memory_watch import wait_fired

POLL_S = 0.05  # how often the watch thread looks at its stop flag


class MemoryPause:
    def __init__(self, driver: CgroupDriver, group: str, limit_bytes: int, on_paused: Callable[[int], None]) -> None:
        self._driver, self._group, self._on_paused = driver, group, on_paused
        self._lock = threading.Lock()
        self._since: float | None = None
        self._total_s = 0.0
        self._stop = threading.Event()
        driver.set_memory_limit(group, limit_bytes)
        driver.set_memory_pause(group, True)
        self._watch = driver.open_memory_watch(group)
        self._thread = threading.Thread(target=self._loop, name=f"tangram-mem-{group}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        watch = self._watch
        if watch is None:
            return
        while not self._stop.is_set():
            if not wait_fired(watch, POLL_S) or not watch.consume():
                continue
            with self._lock:
                fresh = self._since is None
                if fresh:
                    self._since = time.monotonic()
            if fresh:
                with contextlib.suppress(OSError):
                    self._on_paused(self._driver.sandbox_memory_bytes(self._group))

    def _resume(self) -> None:
        with self._lock:
            if self._since is not None:
                self._total_s += time.monotonic() - self._since
                self._since = None

    def grow(self, limit_bytes: int) -> None:
        """Raise the env's limit (the kernel wakes the waiting tasks); ends the pause."""
        self._driver.set_memory_limit(self._group, limit_bytes)
        self._resume()

    def oom_kill(self) -> None:
        """Let the kernel's OOM killer end what is over the limit."""
        self._driver.set_memory_pause(self._group, False)
        self._resume()

    def paused_s(self) -> float:
        """Paused time so far (seconds), the current pause included."""
        with self._lock:
            ongoing = time.monotonic() - self._since if self._since is not None else 0.0
            return self._total_s + ongoing

    def close(self, ceiling_bytes: int) -> float:
        """Stop watching, give the env its own limit back (its idle footprint is measured
        against it) with the kernel's OOM killer on; returns the paused time."""
        self._stop.set()
        self._thread.join()
        if self._watch is not None:
            self._watch.close()
        self._resume()
        with contextlib.suppress(OSError):
            self._driver.set_memory_pause(self._group, False)
            self._driver.set_memory_limit(self._group, ceiling_bytes)
        return self._total_s


class MemoryPauses:
    """The open ``MemoryPause`` of each sandbox (one at a time: concurrent actions of one
    env share its cgroup limit, so the first one's watch reports for the env and a later
    one only moves the limit to what the core computed for all of them)."""

    def __init__(self, driver: CgroupDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._open: dict[str, MemoryPause] = {}

    def open(self, sandbox_id: str, group: str, limit_bytes: int, on_paused: Callable[[int], None] | None) -> MemoryPause | None:
        """Apply ``limit_bytes`` for an action's life; with ``on_paused``, pause over it
        (else the kernel OOM-kills over it: pause-and-grow off)."""
        with self._lock:
            if on_paused is None or sandbox_id in self._open:
                self._driver.set_memory_limit(group, limit_bytes)
                return None
            pause = MemoryPause(self._driver, group, limit_bytes, on_paused)
            self._open[sandbox_id] = pause
            return pause

    def grow(self, sandbox_id: str, limit_bytes: int) -> bool:
        with self._lock:
            pause = self._open.get(sandbox_id)
        if pause is not None:
            pause.grow(limit_bytes)
        return pause is not None

    def oom_kill(self, sandbox_id: str) -> bool:
        with self._lock:
            pause = self._open.get(sandbox_id)
        if pause is not None:
            pause.oom_kill()
        return pause is not None

    def restore(self, sandbox_id: str, group: str, ceiling_bytes: int) -> None:
        """After a run that had no watch of its own: the env's own limit again, unless
        another run's watch is open (it restores when it closes)."""
        with self._lock:
            if sandbox_id not in self._open:
                with contextlib.suppress(OSError):
                    self._driver.set_memory_limit(group, ceiling_bytes)

    def close(self, sandbox_id: str, pause: MemoryPause, ceiling_bytes: int) -> float:
        with self._lock:
            if self._open.get(sandbox_id) is pause:
                del self._open[sandbox_id]
        return pause.close(ceiling_bytes)
