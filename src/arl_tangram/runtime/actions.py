"""Shell: what a live action runs (its payload), what it ends with (``ActionResult``), and
the store that holds both between submission and the caller's read.

The core schedules ``ActionSpec`` s and never sees a command or a request body: those stay
here, keyed by action id, until the executor runs the action. Every accepted action ends in
exactly one ``ActionResult``: ``ActionStore.complete`` is first-wins, so a late report (a
run that finished after its node was declared lost, a cancel racing a finish) never
overwrites the outcome the caller already has.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.errors import SpecError


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


Payload = ExecPayload | ServicePayload | ApiPayload | NoopPayload


@dataclass(frozen=True)
class ActionResult:
    """The one terminal result of an action.

    ``queue_s`` runs from arrival to the start decision, ``exec_s`` is the execution the
    manager measured, ``overhead_s`` is the rest of the action completion time (resize,
    launch, loading a replica, result delivery): ``act_s = queue_s + exec_s + overhead_s``.
    ``cause`` names why an action did not run or failed in the infrastructure.
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

    @property
    def act_s(self) -> float:
        return self.queue_s + self.exec_s + self.overhead_s

    @property
    def ok(self) -> bool:
        return self.outcome == "succeeded"


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


class ActionStore:
    """Live actions by id, on the controller's event-loop thread only (not thread-safe)."""

    def __init__(self) -> None:
        self._records: dict[str, ActionRecord] = {}

    def add(self, spec: ActionSpec, payload: Payload, submitted_s: float) -> ActionRecord:
        if spec.action_id in self._records:
            raise SpecError("action_id", "must be unique among live actions", spec.action_id)
        record = ActionRecord(spec, payload, submitted_s, asyncio.get_running_loop().create_future())
        self._records[spec.action_id] = record
        return record

    def get(self, action_id: str) -> ActionRecord | None:
        return self._records.get(action_id)

    def complete(self, action_id: str, result: ActionResult) -> bool:
        """Record the terminal result; False (and nothing changes) if it already has one."""
        record = self._records.get(action_id)
        if record is None or record.result is not None:
            return False
        record.result = result
        if not record.done.done():
            record.done.set_result(result)
        return True

    def forget(self, action_id: str) -> None:
        """Drop a read result (the caller has it)."""
        record = self._records.get(action_id)
        if record is not None and record.result is not None:
            del self._records[action_id]

    def unfinished(self) -> list[str]:
        return sorted(a for a, r in self._records.items() if r.result is None)

    def __len__(self) -> int:
        return len(self._records)
