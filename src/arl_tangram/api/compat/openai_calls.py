"""Shell: what every OpenAI-compatible route shares: errors in OpenAI's shape, the
caller's tenant from ``Authorization: Bearer``, body validation, resolving ``model`` to a
service with the right handler, and one service action per call.

``openai_face`` (models, embeddings, scoring completions, classify) and ``chat``
(generation) both build on it; neither imports the other's routes' internals.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from arl_tangram.api.compat.tenancy import Unauthorized, compat_state, tenant_for
from arl_tangram.api.json_body import read_json
from arl_tangram.api.state import DEFAULT_TENANT, ApiState, Overloaded, new_id
from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ServicePayload, read_result


class OpenAIError(Exception):
    """An error answered in OpenAI's shape with ``status``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def caller_tenant(state: ApiState, request: Request) -> str:
    if not state.tokens:
        return DEFAULT_TENANT  # like vLLM without --api-key: any key (or none) is fine
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    try:
        return tenant_for(state, token)
    except Unauthorized as exc:
        raise OpenAIError(401, str(exc), "authentication_error", None, "invalid_api_key") from None


def parse_body(model: type[BaseModel], raw: Any) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        raise OpenAIError(400, f"{param}: {first.get('msg', 'invalid')}", param=param) from None


def resolve_service(state: ApiState, tenant: str, model: str, handlers: tuple[str, ...], route: str) -> str:
    """The internal name of ``model`` for ``tenant``, checked to have one of ``handlers``."""
    internal = state.service_internal(tenant, model)
    if internal is None:
        raise OpenAIError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model", "model_not_found")
    gpu = state.runtime.agent.gpu
    handler = gpu.service_info(internal).handler if gpu is not None else None
    if handler not in handlers:
        raise OpenAIError(400, f"model `{model}` serves `{handler}` requests; {route} needs a service with handler {' or '.join(handlers)}", param="model")
    return internal


def submit_service(state: ApiState, tenant: str, internal: str, request: dict[str, Any]) -> ActionRecord:
    """Submit one service action (one device per unit, as the SDK's ``call``); overload 503."""
    service = state.controller.loop.state.spec.services[internal]
    spec = ActionSpec(
        state.scoped(tenant, new_id("oai")), internal, Binding("service", internal), tenant,
        demand_per_unit=ResourceVector(gpu_devices=1), key=ResourceKind.GPU,
        dop_min=service.devices_min, dop_max=service.devices_max,
    )  # fmt: skip
    try:
        return state.submit(spec, ServicePayload(request), None)
    except Overloaded as exc:
        raise OpenAIError(503, f"overloaded: {exc}", "server_error", code="overloaded") from None


async def call_service(state: ApiState, tenant: str, internal: str, request: dict[str, Any]) -> dict[str, Any]:
    """One service action; its output, or an ``OpenAIError``: invalid input 400 (its
    ``param`` the field the handler named), overload 503, anything else 500."""
    record = submit_service(state, tenant, internal, request)
    try:
        result: ActionResult = await read_result(record)  # held outputs (Ray) fetched
    except asyncio.CancelledError:
        state.controller.cancel(record.spec.action_id)
        raise
    state.ack(record)
    if result.ok:
        output: dict[str, Any] = result.output
        return output
    cause = result.cause or result.outcome
    if cause.startswith("InvalidRequestError"):
        named = re.search(r"field '([^']+)'", cause)
        raise OpenAIError(400, cause.partition(": ")[2] or cause, param=named.group(1) if named else None)
    raise OpenAIError(500, f"the model call ended {result.outcome}: {cause}", "server_error")


async def serve_face(request: Request, work: Any) -> Response:
    """Tenant, then ``work(state, tenant, raw_body)`` in a tracked task; OpenAI errors."""
    state: ApiState = compat_state(request).api
    try:
        tenant = caller_tenant(state, request)
        raw = await read_json(request) if request.method == "POST" else None
        if request.method == "POST" and not isinstance(raw, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        out = await asyncio.shield(state.spawn(work(state, tenant, raw)))
        return out if isinstance(out, Response) else JSONResponse(out)  # a stream is answered as it is
    except OpenAIError as exc:
        return exc.response()
    except ValueError as exc:  # a body that is not JSON
        return OpenAIError(400, f"the body must be JSON: {exc}").response()
    except Exception as exc:
        if type(exc).__name__ in ("OverloadedError", "TenantLimitError"):
            return OpenAIError(429 if "Tenant" in type(exc).__name__ else 503, str(exc), "server_error").response()
        raise
