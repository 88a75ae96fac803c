"""Shell: one run of a SandboxFusion program probes how long it is; its siblings wait for that.

Why: verl sends each test case of a generation as its own call, all at once (3 per
generation in ``bench verdicts``), with the same code. Under verl's load (issue 26: 192 calls
for 64 pool sandboxes, half of them looping for their 3-s timeout) looping runs ended up
holding every sandbox, and each also took its first quantum of exclusive CPU before the
core demoted it, while short programs waited: the p99 of the short calls was 1.3-2x the
baseline's, which starts every run at once under CFS. Processor sharing cannot be beaten
on equal short jobs by a scheduler that does not know which runs are long; a program's
first run tells. So the first call of a program to get a sandbox is its probe, and the
program's other calls wait in the pool (``CodeEnvPool.acquire(probing=...)``) until the
probe ends (the program is short: they go to the front of the line) or is demoted or times
out (it is long: they wait behind every call not known to be long, until their own
start-by time comes near, ``pool.HOLD_MARGIN_S``). A verdict never changes: a held-back run
starts, as any run, while its whole ``run_timeout`` still fits before the client's deadline
(else 504, which verl retries).

Contract: ``key(tenant, body)`` fingerprints a program (tenant, language, code; not stdin:
the test cases of one generation share it). ``start(key)`` makes the caller's call a probe
of the program (it holds a sandbox) and returns its ``Probe``; ``Probe.watch(record)``
follows its run step (demoted: long); ``Probe.end(long)`` ends it (idempotent; every call
ends its probe). ``is_probing(key)``: a probe of it may still tell (its run has not started,
or started less than ``PROBE_WINDOW_S`` ago: a slow program that does not compute is never
demoted, and its siblings must not wait for its end); ``is_long(key)``: a run of it was
demoted or timed out within ``TTL_S``. ``on_change`` is called after each probe ends, and
every ``TICK_S`` while probes are out (the pool then lets waiters whose probe no longer
decides look again). The face probes only when the core preempts (without demotion a
probe could only tell "short"). At most ``MAX_KEYS`` programs
are kept, the oldest dropped first; a tenant's programs only ever reorder that tenant's own
calls (the pool's buckets are per tenant). Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.api.compat.retries import fingerprint
from arl_tangram.runtime.actions import ActionRecord

TTL_S = 60.0  # assumption: a training step's calls of one generation arrive within a minute
MAX_KEYS = 20_000
#: a probe whose run has run this long without ending or being demoted decides nothing (a
#: slow program that does not compute, a sleep, is never demoted): its siblings go on.
#: Assumption: a looping run is demoted within it on a loaded host (its launch, which can
#: wait on the kernel's cgroup lock, its first quantum, at most 0.1 s in ``bench
#: verdicts``, then ``MIN_CPU_S`` of its own CPU); 1 s was too short there in one run
PROBE_WINDOW_S = 2.0
TICK_S = 0.1  # how often probes in flight are looked at for an expired window


def key(tenant: str, body: Any) -> bytes:
    """A program's fingerprint (``body``: a ``RunCodeRequest``)."""
    return fingerprint(tenant, body.language, body.code)


@dataclass
class _Program:
    probes: list[Probe] = field(default_factory=list)  # its probes not ended yet
    long_at: float | None = None  # when a run of it was last seen long


class Probe:
    """One call of a program holding a sandbox, until its run step shows how long it is."""

    def __init__(self, owner: LongPrograms, entry: _Program) -> None:
        self._owner, self._entry, self._ended = owner, entry, False
        self._record: ActionRecord | None = None

    def watch(self, record: ActionRecord) -> None:
        """Follow the call's run step: its demotion ends the probe, long."""
        self._record = record
        record.on_demoted.append(lambda: self.end(long=True))

    def deciding(self, now: float) -> bool:
        """Whether the probe may still tell: its run has not started, or started less than
        ``PROBE_WINDOW_S`` ago (``ActionRecord.started_s``: time.monotonic)."""
        started = self._record.started_s if self._record is not None else None
        return started is None or now - started < PROBE_WINDOW_S

    def end(self, long: bool = False) -> None:
        """The probe is over (``long``: its run was demoted or timed out); idempotent."""
        if long:
            self._entry.long_at = time.monotonic()
        if self._ended:
            return
        self._ended = True
        self._entry.probes.remove(self)
        self._owner.out -= 1
        self._owner.on_change()


class LongPrograms:
    """Programs' probes in flight and programs seen long lately (see the module docstring)."""

    def __init__(self) -> None:
        self._programs: collections.OrderedDict[bytes, _Program] = collections.OrderedDict()
        self.on_change: Callable[[], None] = lambda: None
        self.out = 0  # probes not ended yet, of all programs
        self._ticking = False

    def start(self, program: bytes) -> Probe:
        """The caller's call of ``program`` holds a sandbox now: it probes the program."""
        entry = self._programs.get(program)
        if entry is None:
            entry = self._programs[program] = _Program()
            while len(self._programs) > MAX_KEYS:
                self._programs.popitem(last=False)
        self._programs.move_to_end(program)
        probe = Probe(self, entry)
        entry.probes.append(probe)
        self.out += 1
        if not self._ticking:  # a window's end is no event: look again while probes are out
            self._ticking = True
            asyncio.get_running_loop().call_later(TICK_S, self._tick)
        return probe

    def _tick(self) -> None:
        self.on_change()
        self._ticking = self.out > 0
        if self._ticking:
            asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def is_probing(self, program: bytes) -> bool:
        """Whether a probe of ``program`` may still tell how long it is (and it is not
        known long already)."""
        entry = self._programs.get(program)
        if entry is None or self.is_long(program):
            return False
        now = time.monotonic()
        return any(probe.deciding(now) for probe in entry.probes)

    def is_long(self, program: bytes) -> bool:
        """Whether a run of ``program`` was demoted or timed out within ``TTL_S``."""
        entry = self._programs.get(program)
        return entry is not None and entry.long_at is not None and time.monotonic() - entry.long_at <= TTL_S

    def __len__(self) -> int:
        return len(self._programs)
