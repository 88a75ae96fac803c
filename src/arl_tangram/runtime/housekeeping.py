"""Shell: the controller's housekeeping: one asyncio task that, every ``interval_s``,
releases envs whose lease ran out, forgets results past their retention, prunes the
journal of rows older than the request-id window, and posts the nodes' memory reports
(``runtime.mem_reports``).

Who calls: ``Controller.start`` starts it, ``Controller.aclose`` cancels and awaits it
(structured: it never outlives its controller). ``sweep()`` is one pass, synchronous, on the
event-loop thread: tests drive it directly with a manual clock. Releasing an expired env
goes through the same path as a client's release (``EnvReleased``). An env with an
unfinished action (running or queued), or one still being created, is never expired, so a
release never ends work a client is waiting on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from arl_tangram.runtime.actions import ActionStore
from arl_tangram.runtime.config import ServiceSettings
from arl_tangram.runtime.journal import Journal
from arl_tangram.runtime.leases import EnvLeases, ExpiredEnv, Lease
from arl_tangram.runtime.loop import Clock
from arl_tangram.runtime.mem_reports import MemoryReporter, ReportHost
from arl_tangram.runtime.shutdown import Creations
from arl_tangram.runtime.tenants import Admission


class _Expiring(Protocol):
    def expire(self) -> Any: ...


class HousekeepingHost(ReportHost, Protocol):
    """What housekeeping needs of the controller (``Controller`` is one)."""

    @property
    def settings(self) -> ServiceSettings: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def leases(self) -> EnvLeases: ...

    @property
    def store(self) -> ActionStore: ...

    @property
    def journal(self) -> Journal | None: ...

    @property
    def executor(self) -> Creations | None: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def snapshots(self) -> _Expiring: ...

    @property
    def on_env_expired(self) -> list[Callable[[ExpiredEnv], None]]: ...

    def release_env(self, env_id: str) -> None: ...

log = logging.getLogger(__name__)
MAX_INTERVAL_S = 1.0  # expiry is late by at most this (or a quarter of the shortest TTL)
MIN_INTERVAL_S = 0.01
PRUNE_EVERY_S = 60.0  # journal rows past the request-id window are deleted this often
RATE_SMOOTHING = 0.3  # weight of the newest sample in the completion-rate estimate


class Housekeeper:
    def __init__(self, controller: HousekeepingHost) -> None:
        self.controller = controller
        settings = controller.settings
        shortest_s = min(settings.env_idle_ttl_s, settings.result_retention_s) / 4
        self.interval_s = max(MIN_INTERVAL_S, min(MAX_INTERVAL_S, shortest_s))
        self._task: asyncio.Task[None] | None = None
        self._pruned_s: float | None = None
        self._rate_at: tuple[float, int] | None = None  # (clock, completions seen) at the last sweep
        self._completions = 0
        self.memory = MemoryReporter(controller)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tangram-housekeeping")

    async def aclose(self) -> None:
        """Cancel the sweep task and wait for it. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.sweep()
                await asyncio.to_thread(self.controller.snapshots.expire)  # disk work: off the loop
                await self.memory.poll()
            except Exception:
                log.exception("a housekeeping sweep failed; the next one tries again")

    def note_completion(self) -> None:
        self._completions += 1

    def sweep(self) -> list[ExpiredEnv]:
        """One pass; returns the envs it released."""
        c = self.controller
        now_s = c.clock.now()
        expired = [self._expire(lease, now_s) for lease in c.leases.due(now_s, self._busy)]
        c.store.expire(now_s - c.settings.result_retention_s)
        self._update_rate(now_s)
        if c.journal is not None and (self._pruned_s is None or now_s - self._pruned_s >= PRUNE_EVERY_S):
            self._pruned_s = now_s
            c.journal.prune(*self.prune_cuts())
        return expired

    def prune_cuts(self) -> tuple[float, float]:
        """Wall-clock cuts of the journal: request ids past their window, results past retention."""
        now_wall_s, settings = time.time(), self.controller.settings
        return now_wall_s - settings.request_id_ttl_s, now_wall_s - settings.result_retention_s

    def _busy(self, env_id: str) -> bool:
        c = self.controller
        creating = c.executor is not None and env_id in c.executor.env_waiters
        return creating or c.store.unfinished_on(env_id) > 0

    def _expire(self, lease: Lease, now_s: float) -> ExpiredEnv:
        c = self.controller
        record = ExpiredEnv(lease.env_id, lease.tenant, now_s - lease.last_used_s, now_s, time.time())
        c.release_env(lease.env_id)
        c.leases.note_expired(record)
        log.info(
            "env %s of tenant %s released: its lease expired after %.1f s unused (env_idle_ttl_s=%.1f)",
            lease.env_id, lease.tenant, record.idle_s, c.settings.env_idle_ttl_s,
        )  # fmt: skip
        for listener in list(c.on_env_expired):
            try:
                listener(record)
            except Exception:
                log.exception("an env-expiry listener failed")
        return record

    def _update_rate(self, now_s: float) -> None:
        """Completions per second, smoothed: the admission's Retry-After hint."""
        if self._rate_at is not None and now_s > self._rate_at[0]:
            sample = (self._completions - self._rate_at[1]) / (now_s - self._rate_at[0])
            rate = self.controller.admission.completions_per_s
            self.controller.admission.completions_per_s = sample if rate == 0 else rate + RATE_SMOOTHING * (sample - rate)
        self._rate_at = (now_s, self._completions)
