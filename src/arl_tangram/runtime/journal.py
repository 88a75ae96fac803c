"""Shell: the action journal, one SQLite file (stdlib ``sqlite3``, WAL) that outlives the
service: every accepted action (spec, payload, request id), its start and its result.

Who calls: the controller, on its event-loop thread. Writes never block that loop: each
call serialises its row at once (so a body JSON cannot hold is refused synchronously, with
``SpecError``) and queues it for one writer thread, which commits whatever has queued up in
one transaction (batches of up to ``MAX_BATCH`` rows). Ordering: rows commit in the order
they were queued, so a committed start implies a committed accept. ``started`` and
``flush`` return futures that resolve once their row is committed: the dispatcher awaits
the start before an action runs, which makes "never started" in the journal mean "never
ran" (an action is run at most once across a crash). With ``synchronous=NORMAL`` a commit
survives the process being killed (``kill -9``); only a power loss can undo the last few.

Reads: ``load`` at start (on a worker thread, before any write); ``lookup_request`` on the
loop thread, which also sees rows still queued (read-your-writes for idempotency).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import queue
import sqlite3
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from arl_tangram.core.errors import SpecError

log = logging.getLogger(__name__)
MAX_BATCH = 512  # rows per transaction: bounds the latency a large burst adds to a start
_COLUMNS = (
    "action_id", "tenant", "request_id", "spec", "payload", "submitted_wall_s",
    "started_wall_s", "result", "ended_wall_s", "acked",
)  # fmt: skip
_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    action_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    request_id TEXT,
    spec TEXT NOT NULL,
    payload TEXT NOT NULL,
    submitted_wall_s REAL NOT NULL,
    started_wall_s REAL,
    result TEXT,
    ended_wall_s REAL,
    acked INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS actions_by_request ON actions (tenant, request_id) WHERE request_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS actions_by_end ON actions (ended_wall_s);
"""


_PRUNE = "DELETE FROM actions WHERE ended_wall_s < ? OR (request_id IS NULL AND ended_wall_s < ?)"


@dataclass(frozen=True)
class JournalRow:
    """One action as the journal holds it (wall-clock seconds since the epoch)."""

    action_id: str
    tenant: str
    request_id: str | None
    spec: dict[str, Any]
    payload: dict[str, Any]
    submitted_wall_s: float
    started_wall_s: float | None = None
    result: dict[str, Any] | None = None
    ended_wall_s: float | None = None
    acked: bool = False


@dataclass
class _Op:
    action_id: str
    sql: str
    params: tuple[Any, ...]
    done: concurrent.futures.Future[None] | None = None


class Journal:
    """Open (or create) the journal at ``path``. Blocking: construct it on a worker thread.
    ``close`` commits everything queued and stops the writer (idempotent)."""

    def __init__(self, path: str) -> None:
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self._read = self._connect()
        self._read.executescript(_SCHEMA)
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards the three pending maps (loop thread vs writer)
        self._pending: dict[str, dict[str, Any]] = {}  # action id -> columns queued, not committed
        self._pending_ops: Counter[str] = Counter()
        self._pending_requests: dict[tuple[str, str], str] = {}
        self._closed = False
        self._writer = threading.Thread(target=self._write_loop, name="tangram-journal", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    # -- writes (event-loop thread) --------------------------------------------------------
    def accepted(
        self, action_id: str, tenant: str, request_id: str | None, spec: dict[str, Any], payload: dict[str, Any], wall_s: float
    ) -> None:
        """Queue an accepted action. Raises ``SpecError`` (nothing queued) for a payload JSON cannot hold."""
        try:
            spec_json, payload_json = json.dumps(spec), json.dumps(payload)
        except (TypeError, ValueError) as exc:
            raise SpecError("payload", f"must be JSON-serialisable when the service keeps a journal ({exc})", None) from None
        columns = {
            "action_id": action_id, "tenant": tenant, "request_id": request_id, "spec": spec_json,
            "payload": payload_json, "submitted_wall_s": wall_s, "started_wall_s": None, "result": None,
            "ended_wall_s": None, "acked": 0,
        }  # fmt: skip
        sql = f"INSERT OR IGNORE INTO actions ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
        with self._lock:
            if request_id is not None:
                self._pending_requests[(tenant, request_id)] = action_id
        self._put(_Op(action_id, sql, tuple(columns[c] for c in _COLUMNS)), columns)

    def started(self, action_id: str, wall_s: float) -> concurrent.futures.Future[None]:
        """Queue the start; the future resolves when it is committed."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        sql = "UPDATE actions SET started_wall_s = ? WHERE action_id = ?"
        self._put(_Op(action_id, sql, (wall_s, action_id), done), {"started_wall_s": wall_s})
        return done

    def ended(self, action_id: str, result: dict[str, Any], wall_s: float) -> None:
        result_json = json.dumps(result)
        sql = "UPDATE actions SET result = ?, ended_wall_s = ? WHERE action_id = ?"
        self._put(_Op(action_id, sql, (result_json, wall_s, action_id)), {"result": result_json, "ended_wall_s": wall_s})

    def acked(self, action_id: str) -> None:
        """The caller has the result: it is not reloaded after a restart. A row without a
        request id is deleted (nothing will ask for it again); one with a request id stays,
        idempotent, until pruned."""
        self._put(_Op(action_id, "DELETE FROM actions WHERE action_id = ? AND request_id IS NULL", (action_id,)), {"acked": 1})
        self._put(_Op(action_id, "UPDATE actions SET acked = 1 WHERE action_id = ?", (action_id,)), {"acked": 1})

    def prune(self, requests_before_wall_s: float, results_before_wall_s: float) -> None:
        """Delete rows that ended before ``requests_before_wall_s`` (their request ids stop
        being idempotent), and rows without a request id that ended before
        ``results_before_wall_s`` (their results are past retention)."""
        self._put(_Op("", _PRUNE, (requests_before_wall_s, results_before_wall_s)), None)

    def flush(self) -> concurrent.futures.Future[None]:
        """A future that resolves once everything queued so far is committed."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._put(_Op("", "SELECT 1", (), done), None)
        return done

    def _put(self, op: _Op, columns: dict[str, Any] | None) -> None:
        if self._closed:
            # a late call (an ack racing the service's close): nothing left to write to
            log.debug("journal closed: row for action %s dropped", op.action_id)
            if op.done is not None:
                op.done.set_result(None)
            return
        if columns is not None:
            with self._lock:
                self._pending.setdefault(op.action_id, {}).update(columns)
                self._pending_ops[op.action_id] += 1
        self._queue.put(op)

    # -- the writer thread -------------------------------------------------------------------
    def _write_loop(self) -> None:
        conn = self._connect()
        try:
            while True:
                first = self._queue.get()
                batch = [first]
                while first is not None and len(batch) < MAX_BATCH:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                ops = [op for op in batch if op is not None]
                self._commit(conn, ops)
                if len(ops) < len(batch):
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, ops: list[_Op]) -> None:
        try:
            conn.execute("BEGIN")
            for op in ops:
                try:
                    conn.execute(op.sql, op.params)
                except sqlite3.IntegrityError:
                    log.warning("journal: row for action %s refused (duplicate request id?)", op.action_id)
            conn.execute("COMMIT")
        except sqlite3.Error:
            # The service goes on without durability rather than stopping; say so loudly.
            log.exception("journal: a batch of %d rows could not be committed", len(ops))
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        with self._lock:
            for op in ops:
                if op.action_id and self._pending_ops[op.action_id] > 0:
                    self._pending_ops[op.action_id] -= 1
                    if self._pending_ops[op.action_id] == 0:
                        del self._pending_ops[op.action_id]
                        self._forget_pending(op.action_id)
        for op in ops:
            if op.done is not None and not op.done.done():
                op.done.set_result(None)

    def _forget_pending(self, action_id: str) -> None:
        columns = self._pending.pop(action_id, None)
        if columns is not None and columns.get("request_id") is not None:
            self._pending_requests.pop((columns["tenant"], columns["request_id"]), None)

    # -- reads --------------------------------------------------------------------------------
    def load(self, prune: tuple[float, float] | None = None) -> list[JournalRow]:
        """Every row, in submission order, after pruning with ``prune`` (the two cuts of
        ``prune()``). Blocking: call at start, from a worker thread."""
        if prune is not None:
            self._read.execute(_PRUNE, prune)
        cursor = self._read.execute(f"SELECT {', '.join(_COLUMNS)} FROM actions ORDER BY submitted_wall_s, rowid")
        return [_row(dict(zip(_COLUMNS, values, strict=True))) for values in cursor]

    def lookup_request(self, tenant: str, request_id: str) -> JournalRow | None:
        """The row of ``tenant``'s ``request_id``, committed or still queued. One indexed
        read (tens of microseconds) on the caller's thread."""
        with self._lock:
            action_id = self._pending_requests.get((tenant, request_id))
            if action_id is not None:
                return _row(dict(self._pending[action_id]))
        values = self._read.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM actions WHERE tenant = ? AND request_id = ?", (tenant, request_id)
        ).fetchone()
        if values is None:
            return None
        columns = dict(zip(_COLUMNS, values, strict=True))
        with self._lock:  # updates queued since: the read must not miss a result it already has
            columns.update(self._pending.get(columns["action_id"], {}))
        return _row(columns)

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the file. Idempotent; blocking."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._writer.join()
        self._read.close()


def _row(columns: dict[str, Any]) -> JournalRow:
    return JournalRow(
        action_id=columns["action_id"], tenant=columns["tenant"], request_id=columns["request_id"],
        spec=json.loads(columns["spec"]), payload=json.loads(columns["payload"]),
        submitted_wall_s=columns["submitted_wall_s"], started_wall_s=columns["started_wall_s"],
        result=None if columns["result"] is None else json.loads(columns["result"]),
        ended_wall_s=columns["ended_wall_s"], acked=bool(columns["acked"]),
    )  # fmt: skip
