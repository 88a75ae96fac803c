"""Shell: kill every task of a cgroup subtree so that it really ends, for both drivers.

Rules learned the hard way (issue 9):
  * the group is frozen while tasks are signalled, so nothing forks in between, and thawed
    with its CPU quota lifted, so hundreds of killed tasks get the CPU they need to exit
    (an idle sandbox's 1 ms per 100 ms left a fork bomb's tasks unkillable for seconds);
  * host-level processes (the bubblewrap monitor and the action launchers, whose pid lives
    in this process's pid namespace) are spared by default: each reaps its own child when
    that child dies and then exits by itself, so no orphan ever escapes to the host's init;
  * retries are bounded; what is left is returned, never silently dropped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

KILL_TIMEOUT_S = 5.0
#: the kill grace: a timed-out or cancelled action's processes are gone within this many
#: seconds of its timeout firing, whatever its launcher was doing then (``actions._stop``)
KILL_GRACE_S = 2.0


def ns_depth(pid: int) -> int:
    """How many pid namespaces ``pid`` is visible in (``NSpid`` entries); 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return len(line.split()) - 1
    except OSError:
        pass
    return 0


_OWN_DEPTH = ns_depth(os.getpid()) or 1


def is_host_level(pid: int) -> bool:
    """True for a process of this process's pid namespace (a launcher or a monitor)."""
    return ns_depth(pid) == _OWN_DEPTH


def kill_frozen(
    tids: Callable[[], list[int]],
    freeze: Callable[[bool], None],
    unlimit: Callable[[], None],
    *,
    spare_host: bool = True,
    timeout_s: float = KILL_TIMEOUT_S,
) -> int:
    """SIGKILL what ``tids`` lists (sparing host-level tasks when ``spare_host``) until none
    is left or ``timeout_s`` passes; returns how many targets remain (0 = success).

    ``freeze(True/False)`` freezes/thaws the group, ``unlimit`` lifts its CPU quota; either
    may raise ``FileNotFoundError`` when the group is already gone (then nothing is left).
    """
    try:
        unlimit()
    except FileNotFoundError:
        return 0
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            freeze(True)
        except FileNotFoundError:
            return 0
        targets = [t for t in tids() if not (spare_host and is_host_level(t))]
        for tid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(tid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            freeze(False)
        if not targets:
            return 0
        if time.monotonic() > deadline:
            return len([t for t in tids() if not (spare_host and is_host_level(t))])
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
