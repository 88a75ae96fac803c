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
ends its probe). ``is_probing(key)``: a probe of it is in flight; ``is_long(key)``: a run of
it was demoted or timed out within ``TTL_S``. ``on_change`` is called after each probe
ends (the pool then lets that program's waiters look again). At most ``MAX_KEYS`` programs
are kept, the oldest dropped first; a tenant's programs only ever reorder that tenant's own
calls (the pool's buckets are per tenant). Event-loop thread only.
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arl_tangram.runtime.actions import ActionRecord

TTL_S = 60.0  # assumption: a training step's calls of one generation arrive within a minute
MAX_KEYS = 20_000


def key(tenant: str, body: Any) -> bytes:
    """A program's fingerprint (``body``: a ``RunCodeRequest``)."""
    h = hashlib.blake2b(digest_size=16, person=b"long-programs")
    for part in (tenant, body.language, body.code):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


@dataclass
class _Program:
    in_flight: int = 0  # its probes not ended yet
    long_at: float | None = None  # when a run of it was last seen long


class Probe:
    """One call of a program holding a sandbox, until its run step shows how long it is."""

    def __init__(self, owner: LongPrograms, entry: _Program) -> None:
        self._owner, self._entry, self._ended = owner, entry, False

    def watch(self, record: ActionRecord) -> None:
        """Follow the call's run step: its demotion ends the probe, long."""
        record.on_demoted.append(lambda: self.end(long=True))

    def end(self, long: bool = False) -> None:
        """The probe is over (``long``: its run was demoted or timed out); idempotent."""
        if long:
            self._entry.long_at = time.monotonic()
        if self._ended:
            return
        self._ended = True
        self._entry.in_flight -= 1
        self._owner.on_change()


class LongPrograms:
    """Programs' probes in flight and programs seen long lately (see the module docstring)."""

    def __init__(self) -> None:
        self._programs: collections.OrderedDict[bytes, _Program] = collections.OrderedDict()
        self.on_change: Callable[[], None] = lambda: None

    def start(self, program: bytes) -> Probe:
        """The caller's call of ``program`` holds a sandbox now: it probes the program."""
        entry = self._programs.get(program)
        if entry is None:
            entry = self._programs[program] = _Program()
            while len(self._programs) > MAX_KEYS:
                self._programs.popitem(last=False)
        self._programs.move_to_end(program)
        entry.in_flight += 1
        return Probe(self, entry)

    def is_probing(self, program: bytes) -> bool:
        """Whether a probe of ``program`` is in flight (and it is not known long)."""
        entry = self._programs.get(program)
        return entry is not None and entry.in_flight > 0 and not self.is_long(program)

    def is_long(self, program: bytes) -> bool:
        """Whether a run of ``program`` was demoted or timed out within ``TTL_S``."""
        entry = self._programs.get(program)
        return entry is not None and entry.long_at is not None and time.monotonic() - entry.long_at <= TTL_S

    def __len__(self) -> int:
        return len(self._programs)
