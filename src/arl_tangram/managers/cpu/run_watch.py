"""Shell: timed work a run's pump thread does for it, so that a run starts no thread of its own.

Why: every run with a memory grant started one more thread, for its grant's watch
(``memory_pause``): under verl's load (issue 26: 64 calls, 384 runs a round) hundreds of
thread starts a round, each taking the interpreter lock while the event loop that accepts
the requests waited for it. The pump thread (``proc_io.pump``) already sleeps in a selector
until its program writes, exits or reaches its deadline; it now also wakes for its watchers'
fds and due times and calls ``serve`` on them. (The demotion handle, ``preempt.RunHandle``,
was served this way too and went back to timers: its punctual 50-ms tries for every run
the core wanted demoted slowed short runs 2-3x under load, measured. Its timers now share
one thread, ``timer_queue.RUN_TIMERS``.)

Contract: ``serve`` runs on the pump thread only, from the run's start until its program has
exited (never after ``pump`` returns); other threads change a watcher's wants by poking its
``Waker``, which is one of its ``watched_fds``. A watcher's fds may change after any
``serve``: the pump registers them again after each (an fd closed by another thread and its
number reused is re-added, not mistaken for the old one).
"""

from __future__ import annotations

import contextlib
import os
from typing import Protocol


class RunWatcher(Protocol):
    def watched_fds(self) -> tuple[int, ...]:
        """The fds whose readiness has the pump call ``serve`` (read after each ``serve``)."""
        ...

    def serve(self, now: float, ready: frozenset[int]) -> float | None:
        """Do what is due at ``now`` (monotonic; ``ready``: which of its fds are readable);
        return when it wants to be served next (monotonic), or None for only on its fds.
        It must consume what made its fds readable, or they wake the pump again at once."""
        ...


class Waker:
    """An eventfd that another thread writes so that the pump serves its watcher soon.

    Not thread-safe on its own: the owner pokes and closes it under its own lock, so a poke
    never reaches a closed (or reused) fd number."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.closed = False

    def poke(self) -> None:
        if not self.closed:
            with contextlib.suppress(BlockingIOError):  # saturated: readable already
                os.eventfd_write(self.fd, 1)

    def drain(self) -> None:
        if not self.closed:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self.fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)
