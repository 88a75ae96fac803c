"""Shell: what a restarted controller makes of the journal a previous process left.

Rules (every accepted action ends with an outcome, never silence):
  * an ended action keeps its result: readable by id until acknowledged or its retention
    (counted from when it ended, in wall time) runs out, and its request id stays idempotent
    for ``request_id_ttl_s``;
  * an action that never started is submitted again under its own id (same spec, payload,
    request id; its queue time counts from the first arrival);
  * an action that had started ends ``error`` with cause ``service_restarted: ...``: its
    process died with the old service, and running it twice could do harm;
  * an action bound to an env that had not started ends the same way: envs do not survive a
    restart (the CPU manager's keeper and startup sweep destroy the old sandboxes), so it has
    nothing to run against.

Who calls: ``Controller.start`` (``restore_results``, before any new submission),
``Controller.resume`` (``resume``, once services are registered) and ``Controller.submit``
(``journaled``, for a request id whose record was already forgotten).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from arl_tangram.core.elasticity import Learned
from arl_tangram.core.events import ActionSubmitted, Event
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ActionStore
from arl_tangram.runtime.codec import (
    payload_from_dict,
    result_from_dict,
    result_to_dict,
    spec_from_dict,
)
from arl_tangram.runtime.config import ServiceSettings
from arl_tangram.runtime.journal import Journal, JournalRow
from arl_tangram.runtime.loop import Clock

log = logging.getLogger(__name__)
RESTARTED = "service_restarted"


class RecoveryHost(Protocol):
    """What recovery needs of the controller (``Controller`` is one)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> ServiceSettings: ...

    @property
    def store(self) -> ActionStore: ...

    @property
    def journal(self) -> Journal | None: ...

    def learned_model(self, kind: str) -> Learned: ...

    def post(self, event: Event) -> str: ...


@dataclass(frozen=True)
class Resumed:
    """What ``resume`` did: ids re-run, and ids ended ``error`` (``service_restarted``)."""

    rerun: tuple[str, ...] = ()
    ended: tuple[str, ...] = ()


def _record(c: RecoveryHost, row: JournalRow, now_s: float, now_wall_s: float) -> ActionRecord:
    spec = spec_from_dict(row.spec, c.learned_model)
    future: asyncio.Future[ActionResult] = asyncio.get_running_loop().create_future()
    submitted_s = now_s - max(0.0, now_wall_s - row.submitted_wall_s)
    return ActionRecord(spec, payload_from_dict(row.payload), submitted_s, future, request_id=row.request_id)


def restore_results(c: RecoveryHost, rows: list[JournalRow]) -> list[ActionRecord]:
    """Make the retained, unacknowledged results readable, and hold every unfinished action
    (unfinished, not yet queued: readable, and its request id idempotent, at once). Returns
    the unfinished records, in submission order, for ``resume``."""
    now_s, now_wall_s = c.clock.now(), time.time()
    retention_s = c.settings.result_retention_s
    ended = sorted((r for r in rows if r.result is not None), key=lambda r: r.ended_wall_s or 0.0)
    for row in ended:
        age_s = now_wall_s - (row.ended_wall_s or 0.0)
        if row.acked or age_s >= retention_s:
            continue  # forgotten; its request id still answers through ``journaled``
        try:
            record = _record(c, row, now_s, now_wall_s)
        except Exception:
            log.exception("journal: the row of action %s cannot be read back; its result is lost", row.action_id)
            continue
        record.result = result_from_dict(row.result or {})
        record.ended_s = now_s - max(0.0, age_s)
        record.done.set_result(record.result)
        c.store.restore(record)
    unfinished = []
    for row in (r for r in rows if r.result is None):
        try:
            record = _record(c, row, now_s, now_wall_s)
        except Exception as exc:  # a row this version cannot read still gets an outcome
            log.warning("journal: action %s cannot be read back (%s); it ends error", row.action_id, exc)
            if c.journal is not None:
                result = ActionResult(row.action_id, str(row.spec.get("kind", "")), "error", cause=f"{RESTARTED}: unreadable ({exc})")
                c.journal.ended(row.action_id, result_to_dict(result), now_wall_s)
            continue
        record = c.store.add(record.spec, record.payload, record.submitted_s, row.request_id)
        record.extra["journal_started"] = row.started_wall_s is not None
        unfinished.append(record)
    return unfinished


def resume(c: RecoveryHost, records: list[ActionRecord]) -> Resumed:
    """Re-run the never-started, end the rest ``error``; see the module docstring."""
    rerun, ended = [], []
    for record in records:
        spec = record.spec
        why = None
        if record.extra.pop("journal_started", False):
            why = f"{RESTARTED}: the service restarted while the action ran"
        elif spec.binding.kind == "env":
            why = f"{RESTARTED}: env {spec.binding.name} did not survive the restart"
        if record.result is not None:
            continue  # already ended (the controller closed before resuming)
        if why is not None:
            c.store.complete(spec.action_id, ActionResult(spec.action_id, spec.kind, "error", cause=why))
            ended.append(spec.action_id)
        else:
            c.post(ActionSubmitted(spec, submitted_s=record.submitted_s))
            rerun.append(spec.action_id)
    if records:
        log.info("journal: %d action(s) re-run, %d ended error (%s)", len(rerun), len(ended), RESTARTED)
    return Resumed(tuple(rerun), tuple(ended))


def journaled(c: RecoveryHost, tenant: str, request_id: str) -> ActionRecord | None:
    """The journaled record of a request id whose live record was forgotten (acknowledged
    or past retention), its ``done`` resolved; None without a journal or such a row."""
    if c.journal is None:
        return None
    row = c.journal.lookup_request(tenant, request_id)
    if row is None:
        return None
    record = _record(c, row, c.clock.now(), time.time())
    result = ActionResult(row.action_id, record.spec.kind, "error", cause=f"{RESTARTED}: no result was journaled")
    record.result = result_from_dict(row.result) if row.result is not None else result
    record.done.set_result(record.result)
    return record
