"""Shell: one thread that runs every run handle's timed work (``preempt.RunHandle``).

Why: a handle retries a wanted demotion every 50 ms until its run has used enough CPU, and
ages a demoted run's weight every 2 s. With a ``threading.Timer`` per try, 64 runs meant
over a thousand thread starts a second; under verl's load (issue 26, 256 calls) a
``py-spy --gil`` profile of the server put 43% of the interpreter lock's samples in timer
threads starting and ending, while the event loop that answers the calls waited for it.

Contract: ``call_later(delay_s, fn)`` runs ``fn()`` once on the queue's thread about
``delay_s`` from now, unless ``cancel`` came first; callbacks run one at a time, in due
order, so they must be short (a cgroup read or write) and must not call back into the
queue while holding a lock that ``cancel``'s caller holds. ``cancel`` of a timer that
already ran, or is running, does nothing. An exception in a callback is logged; the queue
runs on. The thread starts with the first timer and is a daemon: nothing here outlives the
process, and a process that ends drops its pending timers (their runs end with it).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timer:
    """A pending call; ``cancel()`` drops it (idempotent)."""

    __slots__ = ("due", "fn", "cancelled")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True  # the heap keeps it until it is due, then skips it


class TimerQueue:
    """Due calls on one daemon thread (see the module docstring)."""

    def __init__(self, name: str = "tangram-timers") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + max(0.0, delay_s), fn)
        with self._cond:
            heapq.heappush(self._heap, (timer.due, next(self._seq), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is timer:
                self._cond.notify()  # due before what the thread sleeps towards
        return timer

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, timer = heapq.heappop(self._heap)
            if timer.cancelled:
                continue
            try:
                timer.fn()
            except Exception:  # a callback's bug must not stop every other run's timers
                log.exception("timer callback %r failed", timer.fn)


#: the process's queue for run handles (``preempt``)
RUN_TIMERS = TimerQueue()
