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
import struct
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from arl_tangram.api.compat.chat import generate_completion
from arl_tangram.api.compat.openai_calls import (
    OpenAIError,
    call_service,
    parse_body,
    resolve_service,
    serve_face,
)
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.state import ApiState

router = APIRouter(tags=["openai"], route_class=JsonBodyRoute)  # its contract is OpenAI's and vLLM's; in /openapi.json under its tag
MAX_INPUTS = 256


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


@router.get("/v1/models")
async def models(request: Request) -> Response:
    async def work(state: ApiState, tenant: str, _raw: Any) -> dict[str, Any]:
        data = [{"id": ext, "object": "model", "created": 0, "owned_by": "arl-tangram"} for ext, _i, _s in state.services_of(tenant)]
        return {"object": "list", "data": data}

    return await serve_face(request, work)


def _inputs(value: Any) -> list[Any]:
    """One request per input: a str, a token list, or a list of either."""
    items = [value] if isinstance(value, str) or (isinstance(value, list) and value and type(value[0]) is int) else list(value)
    if not items or len(items) > MAX_INPUTS:
        raise OpenAIError(400, f"input: must hold 1 to {MAX_INPUTS} items", param="input")
    return items


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    async def work(state: ApiState, tenant: str, raw: Any) -> dict[str, Any]:
        body: EmbeddingsBody = parse_body(EmbeddingsBody, raw)
        if body.encoding_format not in ("float", "base64"):
            raise OpenAIError(400, "encoding_format: must be float or base64", param="encoding_format")
        internal = resolve_service(state, tenant, body.model, ("embed",), "/v1/embeddings")
        output = await call_service(state, tenant, internal, {"input": body.input})
        data = []
        for row in output["data"]:
            vector = shorten(row["embedding"], body.dimensions)
            encoded: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if body.encoding_format == "base64" else vector
            data.append({"object": "embedding", "index": row["index"], "embedding": encoded})
        num_tokens = sum(int(row.get("num_tokens", 0)) for row in output["data"])
        return {"object": "list", "data": data, "model": body.model, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}

    return await serve_face(request, work)


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
            return await generate_completion(state, tenant, raw, generating)
        body: CompletionsBody = parse_body(CompletionsBody, raw)
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        if max_tokens > 1 or (max_tokens == 1 and body.prompt_logprobs is None):
            raise OpenAIError(
                400, "max_tokens: this face scores prompts and does not generate: set max_tokens 0 (with echo "
                "and logprobs) or 1 (with prompt_logprobs)", param="max_tokens",
            )  # fmt: skip
        internal = resolve_service(state, tenant, body.model, ("logprobs",), "/v1/completions")
        prompts = _inputs(body.prompt)
        calls = [call_service(state, tenant, internal, {"tokens": p} if isinstance(p, list) else {"prompt": p}) for p in prompts]
        outputs = await asyncio.gather(*calls)
        num_tokens = sum(len(o["tokens"]) for o in outputs)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()), "model": body.model,
            "choices": [_choice(i, p, o, body) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))],
            "usage": {"prompt_tokens": num_tokens, "completion_tokens": 0, "total_tokens": num_tokens},
        }  # fmt: skip

    return await serve_face(request, work)


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
        body: ClassifyBody = parse_body(ClassifyBody, raw)
        internal = resolve_service(state, tenant, body.model, ("classify",), "/classify")
        one = isinstance(body.input, str) or (bool(body.input) and isinstance(body.input[0], int))
        inputs = [body.input] if one else body.input
        activation = {} if body.use_activation is None else {"use_activation": body.use_activation}
        request_of = [{"input": i, **activation} for i in inputs]
        outputs = await asyncio.gather(*(call_service(state, tenant, internal, r) for r in request_of))
        data = [{"index": i, "label": o.get("label"), "probs": o["probs"], "num_classes": len(o["probs"])} for i, o in enumerate(outputs)]
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": body.model, "data": data, "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    return await serve_face(request, work)
