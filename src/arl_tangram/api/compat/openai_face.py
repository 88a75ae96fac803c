"""Shell: the OpenAI / vLLM face: ``GET /v1/models``, ``POST /v1/embeddings``,
``POST /v1/completions`` (scoring: ``echo`` + ``logprobs``, vLLM's ``prompt_logprobs``),
``POST /classify`` (and ``/v1/classify``).

``model`` names a service the caller's tenant may call (its own or a shared one); every
request is one service action per input, which the scheduler places and the GPU manager
swaps in on demand. On a ``logprobs`` service a completion scores: it asks ``max_tokens`` 0
(with ``echo``) or 1 (with ``prompt_logprobs``, vLLM's teacher-scoring call; the one
generated token is not produced: ``text`` is empty). On a ``generate`` service it
generates (``chat.py``, which also serves ``/v1/chat/completions``). ``logprobs`` hold the
actual token's log-probability only (the handler returns no top-k alternatives); ranks are
``null``. ``/classify`` needs a service whose handler is ``classify`` (a sequence-
classification head, e.g. a reward model; any other answers a clear 400). Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``; the
caller's tenant comes from ``Authorization: Bearer`` (any key when no tokens are set).
"""

from __future__ import annotations

import asyncio
import base64
import re
import struct
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arl_tangram.api.compat.tenancy import Unauthorized, compat_state, tenant_for
from arl_tangram.api.json_body import JsonBodyRoute, read_json
from arl_tangram.api.state import DEFAULT_TENANT, ApiState, Overloaded, new_id
from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ServicePayload, read_result

router = APIRouter(tags=["openai"], route_class=JsonBodyRoute)  # its contract is OpenAI's and vLLM's; in /openapi.json under its tag
MAX_INPUTS = 256


class OpenAIError(Exception):
    """An error answered in OpenAI's shape with ``status``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = Field(None, ge=1)  # honoured as OpenAI does: the first N, re-normalised


class CompletionsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    n: int = Field(1, ge=1, le=1)


class ClassifyBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    input: str | list[str] | list[int] | list[list[int]]  # one text or token-id list, or several
    use_activation: bool | None = None


def _tenant(state: ApiState, request: Request) -> str:
    if not state.tokens:
        return DEFAULT_TENANT  # like vLLM without --api-key: any key (or none) is fine
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    try:
        return tenant_for(state, token)
    except Unauthorized as exc:
        raise OpenAIError(401, str(exc), "authentication_error", None, "invalid_api_key") from None


def _parse(model: type[BaseModel], raw: Any) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()))
        raise OpenAIError(400, f"{param}: {first.get('msg', 'invalid')}", param=param) from None


def _service(state: ApiState, tenant: str, model: str, handlers: tuple[str, ...], route: str) -> str:
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


async def _face(request: Request, work: Any) -> Response:
    """Tenant, then ``work(state, tenant, raw_body)`` in a tracked task; OpenAI errors."""
    state: ApiState = compat_state(request).api
    try:
        tenant = _tenant(state, request)
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


@router.get("/v1/models")
async def models(request: Request) -> Response:
    async def work(state: ApiState, tenant: str, _raw: Any) -> dict[str, Any]:
        data = [{"id": ext, "object": "model", "created": 0, "owned_by": "arl-tangram"} for ext, _i, _s in state.services_of(tenant)]
        return {"object": "list", "data": data}

    return await _face(request, work)


def _inputs(value: Any) -> list[Any]:
    """One request per input: a str, a token list, or a list of either."""
    items = [value] if isinstance(value, str) or (isinstance(value, list) and value and type(value[0]) is int) else list(value)
    if not items or len(items) > MAX_INPUTS:
        raise OpenAIError(400, f"input: must hold 1 to {MAX_INPUTS} items", param="input")
    return items


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    async def work(state: ApiState, tenant: str, raw: Any) -> dict[str, Any]:
        body: EmbeddingsBody = _parse(EmbeddingsBody, raw)
        if body.encoding_format not in ("float", "base64"):
            raise OpenAIError(400, "encoding_format: must be float or base64", param="encoding_format")
        internal = _service(state, tenant, body.model, ("embed",), "/v1/embeddings")
        output = await call_service(state, tenant, internal, {"input": body.input})
        data = []
        for row in output["data"]:
            vector = shorten(row["embedding"], body.dimensions)
            encoded: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if body.encoding_format == "base64" else vector
            data.append({"object": "embedding", "index": row["index"], "embedding": encoded})
        num_tokens = sum(int(row.get("num_tokens", 0)) for row in output["data"])
        return {"object": "list", "data": data, "model": body.model, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}

    return await _face(request, work)


def shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """OpenAI's ``dimensions``: the first N components, L2-normalised again; more than the
    model has is a 400 naming the field (never silently ignored)."""
    if dimensions is None or dimensions == len(vector):
        return vector
    if dimensions > len(vector):
        raise OpenAIError(400, f"dimensions: must be at most the model's {len(vector)}", param="dimensions")
    head = vector[:dimensions]
    norm = sum(x * x for x in head) ** 0.5 or 1.0
    return [x / norm for x in head]


@router.post("/v1/responses")
@router.get("/v1/responses/{response_id}")
async def responses(request: Request) -> Response:
    """Not served: a 404 in OpenAI's shape (the ``openai`` client raises ``NotFoundError``
    with this message), pointing at the route that is."""
    message = "The Responses API is not served here; use /v1/chat/completions (or /v1/completions)."
    return OpenAIError(404, message, "invalid_request_error", None, "unknown_url").response()


def _token_text(token_id: int) -> str:
    return f"token_id:{token_id}"  # vLLM's spelling when tokens are returned as ids


def _choice(index: int, prompt: Any, out: dict[str, Any], body: CompletionsBody) -> dict[str, Any]:
    tokens, lps = out["tokens"], out["token_logprobs"]
    choice: dict[str, Any] = {"index": index, "text": prompt if body.echo and isinstance(prompt, str) else "", "finish_reason": "length", "logprobs": None}
    if body.logprobs is not None:
        names = [_token_text(t) for t in tokens] if body.echo else []
        values = lps if body.echo else []
        top = [None if lp is None else {name: lp} for name, lp in zip(names, values, strict=True)]
        choice["logprobs"] = {"tokens": names, "token_logprobs": values, "top_logprobs": top, "text_offset": None}
    if body.prompt_logprobs is not None:
        entries: list[Any] = [None]
        for token, lp in zip(tokens[1:], lps[1:], strict=True):
            entries.append({str(token): {"logprob": lp, "rank": None, "decoded_token": _token_text(token)}})
        choice["prompt_logprobs"] = entries
    return choice


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    async def work(state: ApiState, tenant: str, raw: Any) -> Any:
        generating = _generating(state, tenant, raw)
        if generating is not None:
            from arl_tangram.api.compat.chat import generate_completion

            return await generate_completion(state, tenant, raw, generating)
        body: CompletionsBody = _parse(CompletionsBody, raw)
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        if max_tokens > 1 or (max_tokens == 1 and body.prompt_logprobs is None):
            raise OpenAIError(
                400, "max_tokens: this face scores prompts and does not generate: set max_tokens 0 (with echo "
                "and logprobs) or 1 (with prompt_logprobs)", param="max_tokens",
            )  # fmt: skip
        internal = _service(state, tenant, body.model, ("logprobs",), "/v1/completions")
        prompts = _inputs(body.prompt)
        calls = [call_service(state, tenant, internal, {"tokens": p} if isinstance(p, list) else {"prompt": p}) for p in prompts]
        outputs = await asyncio.gather(*calls)
        num_tokens = sum(len(o["tokens"]) for o in outputs)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": body.model,
            "choices": [_choice(i, p, o, body) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))],
            "usage": {"prompt_tokens": num_tokens, "completion_tokens": 0, "total_tokens": num_tokens},
        }  # fmt: skip

    return await _face(request, work)


def _generating(state: ApiState, tenant: str, raw: Any) -> str | None:
    """The internal name of the body's model when it is a ``generate`` service, else None."""
    internal = state.service_internal(tenant, raw.get("model")) if isinstance(raw.get("model"), str) else None
    gpu = state.runtime.agent.gpu
    if internal is None or gpu is None:
        return None
    return internal if gpu.service_info(internal).handler == "generate" else None


@router.post("/classify")
@router.post("/v1/classify")
async def classify(request: Request) -> Response:
    async def work(state: ApiState, tenant: str, raw: Any) -> dict[str, Any]:
        body: ClassifyBody = _parse(ClassifyBody, raw)
        internal = _service(state, tenant, body.model, ("classify",), "/classify")
        one = isinstance(body.input, str) or (bool(body.input) and isinstance(body.input[0], int))
        inputs = [body.input] if one else body.input
        activation = {} if body.use_activation is None else {"use_activation": body.use_activation}
        request_of = [{"input": i, **activation} for i in inputs]
        outputs = await asyncio.gather(*(call_service(state, tenant, internal, r) for r in request_of))
        data = [{"index": i, "label": o.get("label"), "probs": o["probs"], "num_classes": len(o["probs"])} for i, o in enumerate(outputs)]
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": body.model, "data": data, "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    return await _face(request, work)
