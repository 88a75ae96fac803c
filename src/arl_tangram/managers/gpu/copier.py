"""Shell: a CPU device's copy thread, at a lower CPU priority than forward passes.

On a CPU device a swap-in copy and the forward passes of resident replicas share the cores.
A copy run in the loading caller's thread competes with them, and with the event loop, at
equal priority: on the bench's 2-core host a resident replica's median call was 1.1-1.8x
slower during 1 GiB swaps. Copies run instead on one thread per device whose nice value is
raised by ``nice`` (Linux: per thread) once, at start: forward passes and the loop preempt
it, while it still gets every idle cycle (side by side in one run: resident-call slowdown
1.48 -> 1.09, swap-in time unchanged). Raising one's own nice needs no privilege; where the
system refuses, copies run at the normal priority. Copies to one device are serialised
(they are bound by memory bandwidth anyway). On CUDA copies stay in the caller's thread: the
copy engine does the work and the thread sleeps on an event.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
_MAX_NICE = 19
# A copy thread still running (or just exiting) while the process exits can abort it in C++
# ("terminate called without an active exception"): close stops and joins it, and so does
# this hook for copiers of managers that were never closed.
_LIVE: weakref.WeakSet[Copier] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for copier in list(_LIVE):
        copier.close(timeout_s=5.0)


class Copier:
    """Runs copies, one at a time, on a thread of lower CPU priority. ``close`` stops it."""

    def __init__(self, name: str, nice: int) -> None:
        self.nice = nice
        self.native_id: int | None = None  # the thread's id (its nice value is per thread)
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        self._started.wait()
        _LIVE.add(self)

    def run(self, copy: Callable[[], T]) -> T:
        """Run ``copy`` on the copy thread and return its result (or raise its exception).

        After ``close`` it runs in the caller's thread (close during a load must not hang it).
        """
        future: Future[T] = Future()
        with self._lock:  # every copy is queued before close's sentinel, or runs here
            queued = not self._closed
            if queued:
                self._queue.put((copy, future))
        return future.result() if queued else copy()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread once the copies queued so far have run (waits ``timeout_s`` for
        that). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        self.native_id = threading.get_native_id()
        try:
            current = os.getpriority(os.PRIO_PROCESS, self.native_id)
            os.setpriority(os.PRIO_PROCESS, self.native_id, min(_MAX_NICE, current + self.nice))
        except (OSError, AttributeError):  # not permitted, or not a POSIX system
            pass
        self._started.set()
        while True:
            item = self._queue.get()
            if item is None:
                return
            copy, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(copy())
            except BaseException as exc:  # handed to the waiting caller
                future.set_exception(exc)
