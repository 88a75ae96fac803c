"""Shell: what a live action runs (its payload), what it ends with (``ActionResult``), and
the store that holds both between submission and the caller's read.

The core schedules ``ActionSpec`` s and never sees a command or a request body: those stay
here, keyed by action id, until the executor runs the action. Every accepted action ends in
exactly one ``ActionResult``: ``ActionStore.complete`` is first-wins, so a late report (a
run that finished after its node was declared lost, a cancel racing a finish) never
overwrites the outcome the caller already has. An ended record stays readable until it is
acknowledged (``forget``) or its retention runs out (``expire``); a client's request id
maps to its record for as long as the record is kept.

Large outputs by reference: a backend whose nodes are remote (Ray) may leave an output it
finds large where it was produced and hand over a ``LazyOutput`` instead, so the bytes
never pass through the controller's loop or its records. The result then holds it in
``held`` (``stdout``, ``stderr`` or ``output``, the field itself left empty) until a reader
resolves it (``read_result``; ``ActionResult.resolved``), which fetches the bytes for that
read only. No Ray type appears here: the backend implements the protocol.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.errors import SpecError

LIVE_OUTPUT_BYTES = 1 << 20  # streamed while running; more waits for the result


@dataclass(frozen=True)
class ExecPayload:
    """A program (argv) or a ``bash -c`` string in the env's sandbox, or in one of its bash
    sessions when ``session_id`` is set."""

    command: str | tuple[str, ...]
    stdin: bytes | None = None
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    timeout_s: float = 60.0
    session_id: str | None = None


@dataclass(frozen=True)
class ServicePayload:
    """A request to a GPU service (its handler's JSON shape)."""

    request: Any


@dataclass(frozen=True)
class ApiPayload:
    """A call to an API provider; ``tokens`` declared by the caller, else read from ``usage``."""

    method: str = "POST"
    path: str = "/"
    json: Any = None
    params: tuple[tuple[str, str], ...] = ()
    tokens: int | None = None
    timeout_s: float = 60.0


@dataclass(frozen=True)
class NoopPayload:
    """An action that needs no resource: a health check, and the floor of the overhead."""


@runtime_checkable
class LazyOutput(Protocol):
    """An output kept where it was produced. ``resolve`` (blocking: call it on a worker
    thread) fetches it: bytes for a stream, the value for a service's output; it raises
    when the output is gone (its node was lost, the service restarted)."""

    size_bytes: int

    def resolve(self) -> Any: ...


@dataclass(frozen=True)
class LostOutput:
    """A held output that can no longer be fetched (e.g. after a restart: the journal keeps
    results without their held outputs)."""

    size_bytes: int
    why: str

    def resolve(self) -> Any:
        raise LookupError(self.why)


@dataclass(frozen=True)
class SnapshotPayload:
    """A ``snapshot`` action: freeze the env's writable layer as ``snapshot_id`` named
    ``name``; or a ``rollback`` action: restart the env on ``snapshot_id``. The result's
    ``output`` is the snapshot's record (a JSON object)."""

    snapshot_id: str
    name: str = ""


Payload = ExecPayload | ServicePayload | ApiPayload | NoopPayload | SnapshotPayload


@dataclass(frozen=True)
class ActionResult:
    """The one terminal result of an action.

    ``queue_s`` runs from arrival to the start decision, ``exec_s`` is the execution the
    manager measured, ``overhead_s`` is the rest of the action completion time (resize,
    launch, loading a replica, result delivery): ``act_s = queue_s + exec_s + overhead_s``.
    ``cause`` names why an action did not run or failed in the infrastructure. ``attempts`` is
    the attempt it ended in: more than 1 when its node was lost and it was retried elsewhere
    (``queue_s`` then runs to the last start: the lost attempts count as queueing).
    ``paused_s``: how long its manager kept it paused (at its memory limit, or preempted);
    counted in ``queue_s``, never in ``exec_s``.
    """

    action_id: str
    kind: str
    outcome: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: Any = None
    queue_s: float = 0.0
    exec_s: float = 0.0
    overhead_s: float = 0.0
    dop: int | None = None
    node_id: str | None = None
    cause: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_s: float = 0.0
    peak_mem_bytes: int = 0
    attempts: int = 1
    paused_s: float = 0.0
    held: Mapping[str, LazyOutput] = field(default_factory=dict)  # outputs left on their node (see the module)

    @property
    def act_s(self) -> float:
        return self.queue_s + self.exec_s + self.overhead_s

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"

    @property
    def deadline_missed(self) -> bool:
        """Rejected because it could no longer start by its ``deadline_s`` (retryable)."""
        return self.outcome == "rejected" and (self.cause or "").startswith("deadline:")

    def resolved(self) -> ActionResult:
        """This result with its held outputs fetched (blocking; itself when none is held).
        An output that cannot be fetched stays empty and ``cause`` says why."""
        if not self.held:
            return self
        values: dict[str, Any] = {}
        lost: list[str] = []
        for name, lazy in sorted(self.held.items()):
            try:
                value = lazy.resolve()
            except Exception as exc:  # a lost node or object: the reader learns it, no raise
                lost.append(f"{name}: held output of {lazy.size_bytes} bytes lost ({type(exc).__name__}: {exc})")
                continue
            values[name] = value.decode(errors="replace") if name in ("stdout", "stderr") else value
        cause = "; ".join(([self.cause] if self.cause else []) + lost) or None
        return replace(self, **values, cause=cause, held={})


async def read_result(record: ActionRecord) -> ActionResult:
    """The action's result as a reader gets it: awaited, its held outputs fetched on a
    worker thread (never on the event loop) for this read; the record keeps the references."""
    result = await asyncio.shield(record.done)
    return await asyncio.to_thread(result.resolved) if result.held else result


@dataclass
class ActionRecord:
    """One live action: spec, payload, the wall times that split its ACT, its result."""

    spec: ActionSpec
    payload: Payload
    submitted_s: float
    done: asyncio.Future[ActionResult]
    started_s: float | None = None
    node_id: str | None = None
    dop: int | None = None
    result: ActionResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None  # the client's idempotency key, unique per tenant
    # The attempt whose result may end the record: 0 before its first start, the start's
    # attempt while it runs, the next one once its node was lost (``RetryAction``), so a
    # lost attempt's late result never becomes the action's.
    attempt: int = 0
    # its env's idle footprint as its manager measured it after the run (memory per action):
    # reported to the core right after the action's ``ActionFinished``
    footprint_bytes: int | None = None
    ended_s: float | None = None  # controller clock when the result was recorded
    # when (time.monotonic) its CPU manager demoted it (``core.preemption``: it ran past its
    # quantum while other work waited, and ``managers.cpu.preempt``: it has computed), None
    # while it was not; ``on_demoted`` callbacks run then (event-loop thread: ``note_demoted``)
    demoted_s: float | None = None
    on_demoted: list[Callable[[], None]] = field(default_factory=list)
    # Output as it is produced (exec actions): (stream, text) chunks, at most
    # LIVE_OUTPUT_BYTES in all, and an event set on each new chunk (and then replaced by a
    # fresh one, so any number of readers wait without clearing it for the others); event-
    # loop thread only. The result keeps the whole (capped) output anyway.
    live_output: list[tuple[str, str]] = field(default_factory=list)
    live_output_bytes: int = 0
    live_output_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note_demoted(self, at_s: float) -> None:
        """The run was demoted at ``at_s`` (event-loop thread): stamp it, tell the watchers
        (once; a run that already ended tells nobody)."""
        if self.demoted_s is not None or self.result is not None:
            return
        self.demoted_s = at_s
        callbacks, self.on_demoted = self.on_demoted, []
        for callback in callbacks:
            callback()

    def add_output(self, stream: str, chunk: bytes) -> None:
        """Keep a chunk for streaming readers (event-loop thread; see ``live_output``)."""
        room = LIVE_OUTPUT_BYTES - self.live_output_bytes
        if room <= 0:
            return
        piece = chunk[:room]
        self.live_output_bytes += len(piece)
        self.live_output.append((stream, piece.decode(errors="replace")))
        changed, self.live_output_changed = self.live_output_changed, asyncio.Event()
        changed.set()


class ActionStore:
    """Live and retained actions by id, on the controller's event-loop thread only (not
    thread-safe). ``now`` is the controller's clock (it stamps ``ended_s``); ``on_complete``
    is called once per record, right after its result is set (the journal, env leases)."""

    def __init__(self, now: Callable[[], float] | None = None) -> None:
        self._records: dict[str, ActionRecord] = {}
        self._by_request: dict[tuple[str, str], str] = {}
        self._ended: deque[tuple[float, str]] = deque()  # completion order = expiry order
        self._unfinished_by_tenant: Counter[str] = Counter()
        self._unfinished_by_env: Counter[str] = Counter()  # env id -> its queued and running actions
        self.num_unfinished = 0
        self.now = now or (lambda: asyncio.get_running_loop().time())
        self.on_complete: Callable[[ActionRecord], None] | None = None

    def add(self, spec: ActionSpec, payload: Payload, submitted_s: float, request_id: str | None = None) -> ActionRecord:
        """Hold a new action. Raises ``SpecError`` for an id (or the tenant's request id)
        already held; callers look a request id up with ``by_request`` first."""
        if spec.action_id in self._records:
            raise SpecError("action_id", "must be unique among live actions", spec.action_id)
        if request_id is not None and (spec.tenant, request_id) in self._by_request:
            raise SpecError("request_id", "must be unique among the tenant's live actions", request_id)
        record = ActionRecord(spec, payload, submitted_s, asyncio.get_running_loop().create_future(), request_id=request_id)
        self._records[spec.action_id] = record
        if request_id is not None:
            self._by_request[(spec.tenant, request_id)] = spec.action_id
        self._unfinished_by_tenant[spec.tenant] += 1
        if spec.binding.kind == "env":
            self._unfinished_by_env[spec.binding.name] += 1
        self.num_unfinished += 1
        return record

    def restore(self, record: ActionRecord) -> None:
        """Hold an ended record read back from the journal at start (its ``ended_s`` on
        this controller's clock). Restore in order of ``ended_s``, before any new result."""
        assert record.result is not None and record.ended_s is not None
        self._records[record.spec.action_id] = record
        if record.request_id is not None:
            self._by_request[(record.spec.tenant, record.request_id)] = record.spec.action_id
        self._ended.append((record.ended_s, record.spec.action_id))

    def get(self, action_id: str) -> ActionRecord | None:
        return self._records.get(action_id)

    def by_request(self, tenant: str, request_id: str) -> ActionRecord | None:
        action_id = self._by_request.get((tenant, request_id))
        return None if action_id is None else self._records.get(action_id)

    def complete(self, action_id: str, result: ActionResult) -> bool:
        """Record the terminal result; False (and nothing changes) if it already has one."""
        record = self._records.get(action_id)
        if record is None or record.result is not None:
            return False
        record.result = result
        record.ended_s = self.now()
        self._ended.append((record.ended_s, action_id))
        if len(self._ended) > 2 * len(self._records) + 1024:
            # acknowledged records leave their entries behind; drop them in bulk (amortised)
            self._ended = deque(e for e in self._ended if self._is_entry(*e))
        _decrement(self._unfinished_by_tenant, record.spec.tenant)
        if record.spec.binding.kind == "env":
            _decrement(self._unfinished_by_env, record.spec.binding.name)
        self.num_unfinished -= 1
        if not record.done.done():
            record.done.set_result(result)
        if self.on_complete is not None:
            self.on_complete(record)
        return True

    def forget(self, action_id: str) -> bool:
        """Drop an ended record (its caller has the result); an unfinished one stays.
        Idempotent; True when something was dropped."""
        record = self._records.get(action_id)
        if record is None or record.result is None:
            return False
        del self._records[action_id]
        if record.request_id is not None:
            self._by_request.pop((record.spec.tenant, record.request_id), None)
        return True

    def expire(self, ended_before_s: float) -> list[str]:
        """Forget every record that ended before ``ended_before_s``; returns their ids.
        Costs only the records it drops (and those acknowledged earlier)."""
        dropped = []
        while self._ended and self._ended[0][0] < ended_before_s:
            ended_s, action_id = self._ended.popleft()
            if self._is_entry(ended_s, action_id) and self.forget(action_id):
                dropped.append(action_id)
        return dropped

    def _is_entry(self, ended_s: float, action_id: str) -> bool:
        record = self._records.get(action_id)
        return record is not None and record.ended_s == ended_s  # not a later action reusing the id

    def unfinished(self) -> list[str]:
        return sorted(a for a, r in self._records.items() if r.result is None)

    def unfinished_of(self, tenant: str) -> int:
        """Accepted and not yet ended actions of ``tenant``."""
        return self._unfinished_by_tenant.get(tenant, 0)

    def unfinished_on(self, env_id: str) -> int:
        """Accepted and not yet ended actions bound to ``env_id`` (queued or running)."""
        return self._unfinished_by_env.get(env_id, 0)

    def __len__(self) -> int:
        return len(self._records)


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
