"""Shell: a running exec's handle, through which the controller demotes it (preemption).

Who calls: the live dispatcher makes one per exec action and passes it to
``CpuManager.exec``, which attaches the slot the action runs in once its grant is applied
and detaches it before the slot ends; ``demote`` may come from any thread at any time
(before the slot exists: it is applied on attach; after the action ended: nothing happens).
Demotion is ``Sandbox.demote``: the program keeps running, unchanged, at the floor CPU
weight on all of the sandbox's cpus; its exclusive cores were re-granted by the core.

A run slow only because the host is contended has used little CPU: it is demoted only
once it has used ``MIN_CPU_S`` (tried again every ``RETRY_S``), so a demotion lands on
programs that compute for long, not on short ones that waited for a cpu.
A verdict must never change because we demoted a run: its timeout is wall time (as
SandboxFusion's), so a run is never demoted within ``final_window_s(timeout)`` of its
limit, and a demoted one gets its normal weight back when it enters that window (a
timer), competing as an equal for its last stretch instead of starving into a timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from arl_tangram.managers.cpu.sandbox import Sandbox

MIN_CPU_S = 0.2  # assumption: a run is demoted once it has *used* this much CPU, not merely waited
RETRY_S = 0.1  # how often a wanted demotion is tried again until it has


def final_window_s(timeout_s: float) -> float:
    """The last stretch of a run's timeout it always runs at its normal weight."""
    return max(1.0, timeout_s / 3)


class RunHandle:
    """Thread-safe: ``attach``/``detach`` from the exec's thread, ``demote`` from anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: tuple[Sandbox, str] | None = None
        self._limit_at = 0.0  # monotonic: when the run's timeout ends
        self._window_s = 0.0
        self._timer: threading.Timer | None = None
        self._wanted = False
        self.demoted = False  # the slot was demoted (read by tests and reports)

    def attach(self, sandbox: Sandbox, slot: str, timeout_s: float) -> None:
        with self._lock:
            self._at = (sandbox, slot)
            self._limit_at = time.monotonic() + timeout_s
            self._window_s = final_window_s(timeout_s)
            if self._wanted:
                self._demote_locked()

    def detach(self) -> None:
        with self._lock:
            self._at = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def demote(self) -> bool:
        """Demote the action now, or as soon as it has a slot; idempotent."""
        with self._lock:
            self._wanted = True
            if self._at is not None and not self.demoted:
                self._demote_locked()
            return self.demoted

    def _demote_locked(self) -> None:
        assert self._at is not None
        promote_in_s = self._limit_at - self._window_s - time.monotonic()
        if promote_in_s <= 0:
            return  # near its limit: never demoted
        sandbox, slot = self._at
        if sandbox.slot_cpu_s(slot) < MIN_CPU_S:
            self._arm(min(RETRY_S, promote_in_s), self._retry)
            return
        self.demoted = sandbox.demote(slot)
        if self.demoted:
            self._arm(promote_in_s, self._promote)

    def _arm(self, after_s: float, fn: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()  # one timer at a time: ``detach`` cancels the one there is
        self._timer = threading.Timer(after_s, fn)
        self._timer.daemon = True
        self._timer.start()

    def _retry(self) -> None:
        with self._lock:
            if self._at is not None and not self.demoted:
                self._demote_locked()

    def _promote(self) -> None:
        with self._lock:
            if self._at is not None:
                self._at[0].promote()
