"""Shell: waiting for one fd to turn readable, with a timeout.

``poll``, not ``select``: a busy server holds over 1024 fds (768 verl connections and the
sandboxes' pipes), and ``select`` refuses any fd from 1024 up (issue 26: sandboxes failed
to start under load with "filedescriptor out of range in select"). The wait sleeps in the
kernel without the interpreter lock.
"""

from __future__ import annotations

import math
import select


def readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` is readable (or hung up) within ``timeout_s`` (0: look once)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout_s * 1000))))
