"""Shell: a run's cancel flag that a selector can wait on.

Why: a pump thread (``proc_io.pump``) that must notice a plain ``threading.Event`` polls it,
every 50 ms. With two hundred runs in flight that is four thousand wake-ups a second, each
taking the interpreter lock, on a host whose cpus the sandboxes already saturate: the event
loop then waits for the lock behind them (requests reached the SandboxFusion face seconds
after verl sent them). ``CancelFlag.set`` also makes its eventfd readable, so the pump sleeps
until its program writes, exits, reaches its deadline or is cancelled.
"""

from __future__ import annotations

import contextlib
import os
import threading


class CancelFlag(threading.Event):
    """A ``threading.Event`` with ``fileno()``: readable once ``set`` (level-triggered, never
    reset). The fd lives as long as the flag: it is closed when the last reference goes, so
    a pump still selecting on it never sees it closed under it."""

    def __init__(self) -> None:
        super().__init__()
        self._fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def fileno(self) -> int:
        return self._fd

    def set(self) -> None:
        super().set()
        with contextlib.suppress(BlockingIOError):  # the counter is saturated: readable already
            os.eventfd_write(self._fd, 1)

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self._fd)
