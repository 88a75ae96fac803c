"""Shell: a running exec's handle, through which the controller demotes it (preemption).

Who calls: the live dispatcher makes one per exec action and passes it to
``CpuManager.exec``, which attaches the slot the action runs in once its grant is applied
and detaches it before the slot ends; ``demote`` may come from any thread at any time
(before the slot exists: it is applied on attach; after the action ended: nothing happens).
Demotion is ``Sandbox.demote``: the program keeps running, unchanged, at the floor CPU
weight on all of the sandbox's cpus; its exclusive cores were re-granted by the core.
"""

from __future__ import annotations

import threading

from arl_tangram.managers.cpu.sandbox import Sandbox


class RunHandle:
    """Thread-safe: ``attach``/``detach`` from the exec's thread, ``demote`` from anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: tuple[Sandbox, str] | None = None
        self._wanted = False
        self.demoted = False  # the slot was demoted (read by tests and reports)

    def attach(self, sandbox: Sandbox, slot: str) -> None:
        with self._lock:
            self._at = (sandbox, slot)
            if self._wanted:
                self.demoted = sandbox.demote(slot)

    def detach(self) -> None:
        with self._lock:
            self._at = None

    def demote(self) -> bool:
        """Demote the action now, or as soon as it has a slot; idempotent."""
        with self._lock:
            self._wanted = True
            if self._at is not None and not self.demoted:
                self.demoted = self._at[0].demote(self._at[1])
            return self.demoted
