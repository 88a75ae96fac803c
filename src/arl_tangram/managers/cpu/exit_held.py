"""Shell: whether a run's program has already ended and only the kernel still holds its exit.

Why: a process's exit takes the kernel's cgroup thread-group semaphore for reading
(``exit_signals``), and every cgroup join (six per launch on cgroup v1) takes it for
writing, behind an RCU grace period. While a join holds it long, a program that called
``exit`` well within its timeout stays blocked in the kernel past it: ``bench verdicts``
(64 verl calls, half looping) saw no request end for 2.7-5 s in 2 runs of about 20, and
short programs that had printed their answer and exited 0 came back ``TimeLimitExceeded``.
That holder was a launcher joining at the floor CPU weight, fixed where demotions land
(``preempt.RunHandle.counting``); any other holder (hundreds of launches at once, issue
26's 256-sandbox pool) still stalls exits. The program's time ended when it called
``exit``; what follows is the platform's, so at its deadline such a run is waited for
(``proc_io.pump(exit_held=...)``), not timed out. (A program stalled elsewhere, in a fork
say, is not covered: it has not ended.)

A task is exiting when it is a zombie, or when ``/proc/<pid>/syscall`` says it is blocked
inside ``exit`` or ``exit_group`` (the kernel sets ``PF_EXITING`` only once it has the
semaphore, so that flag misses exactly this case). A program still has time to run while
any of its processes is elsewhere: one live child is enough for a normal timeout. On an
architecture whose exit syscall numbers are not known here the rule is off (never held).
"""

from __future__ import annotations

import os

#: the exit syscalls' numbers per machine (``uname -m``)
EXIT_SYSCALLS = {"x86_64": (60, 231), "aarch64": (93, 94)}
_OURS = EXIT_SYSCALLS.get(os.uname().machine, ())


def is_exiting(pid: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` is a zombie or blocked inside an exit syscall (False when gone:
    the caller's own wait sees an exit that completed)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return True
        with open(f"{proc}/{pid}/syscall", "rb") as f:
            first = f.read().split(maxsplit=1)
    except (OSError, IndexError):
        return False
    return bool(first) and first[0].isdigit() and int(first[0]) in _OURS


def program_exit_held(pids: list[int], launcher_pid: int) -> bool:
    """Whether the run in a slot has ended by itself: every process of its program
    (``pids``, the slot's, less its ``launcher_pid``) is exiting, or, with none left, the
    launcher itself is (it exits with the program's code once it has reaped it)."""
    program = [p for p in pids if p != launcher_pid]
    if program:
        return all(is_exiting(p) for p in program)
    return launcher_pid in pids and is_exiting(launcher_pid)
