"""Shell: ``/v1/actions``: submit (optionally waiting), get, wait, cancel, acknowledge, stream.

Handlers validate, build the spec, hand it to the controller and await its future; nothing
here decides anything. Waits are on the action's future without cancelling it, so a client
that disconnects or times out loses nothing: the action still ends and ``GET`` reads its
result until it is acknowledged (``DELETE``) or its retention runs out. A retried POST
carrying the same ``Idempotency-Key`` (or ``X-Request-Id``) returns the first action.
The stream (server-sent events) sends the action's state transitions, an exec action's
output as it is produced (``output`` events, up to ``LIVE_OUTPUT_BYTES``; the rest arrives
with the result), and then the final result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter, ValidationError

from arl_tangram.api.auth import State, Tenant, tenant_of
from arl_tangram.api.build import INTERPRETERS, build
from arl_tangram.api.json_body import SMALL_BODY_BYTES, JsonBodyRoute, read_json
from arl_tangram.api.schemas import (
    ERROR_RESPONSES,
    ActionCreate,
    ActionView,
    ServiceAction,
)
from arl_tangram.api.state import ApiState, wall_time_of
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import (
    ActionRecord,
    ActionResult,
    ApiPayload,
    ExecPayload,
    ServicePayload,
)

router = APIRouter(prefix="/v1/actions", tags=["actions"], route_class=JsonBodyRoute)
MAX_WAIT_S = 300.0


def json_response(content: Any, status_code: int = 200) -> Response:
    body = json.dumps(content, separators=(",", ":"), default=repr)
    return Response(body, status_code, media_type="application/json")


def result_dict(r: ActionResult) -> dict[str, Any]:
    return {
        "outcome": r.outcome, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr, "output": r.output,
        "queue_s": r.queue_s, "exec_s": r.exec_s, "overhead_s": r.overhead_s, "act_s": r.act_s, "dop": r.dop,
        "node_id": r.node_id, "cause": r.cause, "stdout_truncated": r.stdout_truncated,
        "stderr_truncated": r.stderr_truncated, "cpu_s": r.cpu_s, "peak_mem_bytes": r.peak_mem_bytes,
        "attempts": r.attempts,
    }  # fmt: skip


def state_of(record: ActionRecord) -> str:
    if record.result is not None:
        return "done"
    return "running" if record.started_s is not None else "queued"


def view(state: ApiState, tenant: str, record: ActionRecord, result: ActionResult | None = None) -> dict[str, Any]:
    """The action as its owner sees it: external ids and names, wall-clock times. ``result``
    (the record's, its held outputs fetched: ``read_view``) replaces the record's own."""
    spec, result = record.spec, result or record.result
    return {
        "action_id": state.external(tenant, spec.action_id),
        "type": record.extra.get("type") or _type_of(record),
        "kind": record.extra.get("kind") or spec.kind.removeprefix(f"~{tenant}/"),
        "state": state_of(record),
        "submitted_at": wall_time_of(record.submitted_s),
        "started_at": wall_time_of(record.started_s) if record.started_s is not None else None,
        "result": result_dict(result) if result is not None else None,
    }


async def read_view(state: ApiState, tenant: str, record: ActionRecord) -> dict[str, Any]:
    """``view`` for an answer: outputs a remote node holds by reference are fetched now, on
    a worker thread, into this answer only (the record keeps the references)."""
    result = record.result
    if result is not None and result.held:
        result = await asyncio.to_thread(result.resolved)
    return view(state, tenant, record, result)


def _type_of(record: ActionRecord) -> str:
    """The API type of an action submitted elsewhere (in process, or before a restart)."""
    payload = record.payload
    if isinstance(payload, ExecPayload):
        return "code" if payload.command in INTERPRETERS.values() else "exec"
    return {ServicePayload: "service", ApiPayload: "api"}.get(type(payload), "noop")


async def _wait(state: ApiState, record: ActionRecord, timeout_s: float) -> None:
    """Up to ``timeout_s`` for the result, or until the server begins to stop; never
    cancels the action."""
    if record.result is None and timeout_s > 0:
        await asyncio.wait((record.done, state.stopping), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)


WaitS = Annotated[float, Query(ge=0.0, le=MAX_WAIT_S, description="wait up to this long for the result")]


#: ``submit_action`` reads its inputs itself (it is the hot path: FastAPI's parameter and
#: dependency machinery cost more than the rest of a no-resource action); this documents them.
SUBMIT_DOC: dict[str, Any] = {
    "parameters": [
        {"name": "wait_s", "in": "query", "required": False, "description": "wait up to this long for the result",
         "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 0}},
        {"name": "idempotency-key", "in": "header", "required": False, "description": "a retried POST with it runs once",
         "schema": {"type": "string", "maxLength": 128}},
        {"name": "x-request-id", "in": "header", "required": False, "description": "the same, when no Idempotency-Key",
         "schema": {"type": "string", "maxLength": 128}},
    ],
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ActionCreate"}}}},
}  # fmt: skip
ACTION_ADAPTER: TypeAdapter[Any] = TypeAdapter(ActionCreate)


async def _body(request: Request) -> Any:
    """The action: a small body straight from its bytes (pydantic's own parser, the fast
    path), a large one through ``read_json`` (off the loop)."""
    length = request.headers.get("content-length")
    try:
        if length is not None and length.isdigit() and int(length) <= SMALL_BODY_BYTES:
            return ACTION_ADAPTER.validate_json(await request.body())
        return ACTION_ADAPTER.validate_python(await read_json(request))
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def _wait_s(request: Request) -> float:
    given = request.query_params.get("wait_s")
    try:
        wait_s = float(given) if given is not None else 0.0
    except ValueError:
        wait_s = -1.0
    if not 0.0 <= wait_s <= MAX_WAIT_S:  # NaN fails this too
        raise SpecError("wait_s", f"must be a number in [0, {MAX_WAIT_S:g}]", given)
    return wait_s


def _request_id(request: Request) -> str | None:
    found = None
    for name in ("idempotency-key", "x-request-id"):  # both checked: both are documented
        value = request.headers.get(name)
        if value is not None:
            if len(value) > 128:
                raise SpecError(name, "must be at most 128 characters", value[:32])
            found = found if found is not None else value
    return found


@router.post("", response_model=ActionView, status_code=201, responses=ERROR_RESPONSES, openapi_extra=SUBMIT_DOC)
async def submit_action(request: Request) -> Response:
    """Submit one action; with ``wait_s`` the answer waits for its result (submit-and-wait)."""
    state: ApiState = request.app.state.api
    tenant = await tenant_of(request)
    wait_s, request_id = _wait_s(request), _request_id(request)
    body = await _body(request)
    spec, payload, external_id = build(state, tenant, body)
    try:
        record = state.submit(spec, payload, request_id)
    except SpecError as exc:
        if exc.field == "action_id":
            return json_response({"error": str(exc), "field": "action_id", "rule": exc.rule, "value": external_id}, 409)
        raise
    if "type" not in record.extra:  # first submission (an idempotent retry keeps the first's)
        record.extra["type"] = body.type
        record.extra["kind"] = body.service if isinstance(body, ServiceAction) else spec.kind
        state.metrics.submitted_one(body.type, tenant)
    if state.controller.journal is not None:
        await state.controller.flush_journal()  # a 201 means it survives a restart
    await _wait(state, record, wait_s)
    return json_response(await read_view(state, tenant, record), 201)


@router.get("/{action_id}", response_model=ActionView, responses=ERROR_RESPONSES)
async def get_action(state: State, tenant: Tenant, action_id: str) -> Response:
    return json_response(await read_view(state, tenant, state.record(tenant, action_id)))


@router.get("/{action_id}/wait", response_model=ActionView, responses=ERROR_RESPONSES)
async def wait_action(state: State, tenant: Tenant, action_id: str, timeout_s: WaitS = 30.0) -> Response:
    """Wait up to ``timeout_s`` for the result; ``state`` says whether it came."""
    record = state.record(tenant, action_id)
    await _wait(state, record, timeout_s)
    return json_response(await read_view(state, tenant, record))


@router.post("/{action_id}/cancel", response_model=ActionView, status_code=202, responses=ERROR_RESPONSES)
async def cancel_action(state: State, tenant: Tenant, action_id: str) -> Response:
    """Withdraw the action: a queued one ends ``cancelled`` in the next round, a running
    one is stopped. Idempotent; an ended action is left as it is."""
    record = state.record(tenant, action_id)
    state.controller.cancel(record.spec.action_id)
    return json_response(await read_view(state, tenant, record), 202)


@router.delete("/{action_id}", status_code=204, responses=ERROR_RESPONSES)
async def ack_action(state: State, tenant: Tenant, action_id: str) -> Response:
    """Acknowledge an ended action: its result is no longer needed and is dropped."""
    record = state.record(tenant, action_id)
    if record.result is None:
        rule = "must have ended before it is acknowledged (cancel it first)"
        return json_response({"error": f"action_id: {rule}", "field": "action_id", "rule": rule, "value": action_id}, 409)
    state.ack(record)
    return Response(status_code=204)


@router.get(
    "/{action_id}/events",
    responses={**ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}, "description": "state transitions and live output, then the result"}},
)
async def stream_action(state: State, tenant: Tenant, action_id: str) -> StreamingResponse:
    """Server-sent events: one ``state`` event per transition (queued, running, done; the
    last one carries the result) and ``output`` events (``{"stream", "text"}``) while an exec
    action runs. A disconnect ends the stream, never the action."""
    record = state.record(tenant, action_id)
    return StreamingResponse(_events(state, tenant, record), media_type="text/event-stream")


async def _events(state: ApiState, tenant: str, record: ActionRecord) -> AsyncIterator[str]:
    last = None
    sent = 0  # live output chunks already streamed
    while True:
        now = state_of(record)
        for stream, text in record.live_output[sent:]:  # before "done": output precedes the result
            yield f"event: output\ndata: {json.dumps({'stream': stream, 'text': text})}\n\n"
        sent = len(record.live_output)
        if now != last:
            yield f"event: state\ndata: {json.dumps(await read_view(state, tenant, record), default=repr)}\n\n"
            last = now
        if now == "done":
            return
        # queued -> running has no signal of its own: poll it; running -> done is the future,
        # new output the record's event
        timeout_s = 0.02 if now == "queued" else 15.0
        changed = record.live_output_changed  # taken before the check: no chunk is missed
        if len(record.live_output) > sent:
            continue
        output = asyncio.ensure_future(changed.wait())
        try:
            done, _ = await asyncio.wait(
                (record.done, state.stopping, output), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )  # fmt: skip
        finally:
            output.cancel()
        if output in done:
            continue
        if state.stopping.done() and record.result is None:
            return
        if not done and now == "running":
            yield ": keep-alive\n\n"
