"""Shell: the OpenAI generation faces: ``POST /v1/chat/completions`` and generating
``POST /v1/completions`` (``max_tokens`` > 1), for services whose handler is ``generate``.

Each request is one service action (as the SDK's ``tg.call``): the scheduler places it on a
replica, where it joins that replica's continuous batch. ``n`` must be 1. ``stream`` answers
server-sent events in OpenAI's chunk format (``chat.completion.chunk`` /
``text_completion``), one per decoded token as the replica produces it, then ``data:
[DONE]``; a client that disconnects cancels the generation. Errors use OpenAI's shape; a
prompt longer than the model's context (with ``max_tokens``) is a 400 naming ``messages``
(``prompt`` on ``/v1/completions``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from arl_tangram.api.compat.openai_calls import (
    call_service,
    parse_body,
    resolve_service,
    serve_face,
    submit_service,
)
from arl_tangram.api.state import ApiState
from arl_tangram.runtime.actions import ActionRecord, read_result

router = APIRouter(tags=["openai"])  # in /openapi.json, tagged: a reader or a client generator sees the face


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    ignore_eos: bool | None = None  # vLLM's extension: decode past EOS (fixed-length runs)


class GenerateCompletionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: str | list[int]
    max_tokens: int = Field(16, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    logprobs: int | None = Field(None, ge=0, le=5)
    stream: bool = False
    ignore_eos: bool | None = None


def _request(body: Any, **fields: Any) -> dict[str, Any]:
    """The handler's request: the sampling fields the caller set, and ``fields``."""
    names = ("temperature", "top_p", "seed", "stop", "ignore_eos")
    out = {k: getattr(body, k) for k in names if getattr(body, k) is not None}
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


def _chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if entries is None:
        return None
    def one(e: dict[str, Any]) -> dict[str, Any]:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode())}
    return {"content": [{**one(e), "top_logprobs": [one(t) for t in e["top_logprobs"]]} for e in entries]}


def _usage(out: dict[str, Any]) -> dict[str, int]:
    p, c = out["prompt_tokens"], out["completion_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    async def work(state: ApiState, tenant: str, raw: Any) -> Any:
        body: ChatBody = parse_body(ChatBody, raw)
        internal = resolve_service(state, tenant, body.model, ("generate",), "/v1/chat/completions")
        call = _request(
            body, messages=[m.model_dump() for m in body.messages], max_tokens=body.max_completion_tokens or body.max_tokens,
            logprobs=body.logprobs or None, top_logprobs=body.top_logprobs if body.logprobs else None,
        )  # fmt: skip
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
        if body.stream:
            return await _stream(state, tenant, internal, call, head, "chat")
        out = await call_service(state, tenant, internal, call)
        choice = {"index": 0, "message": {"role": "assistant", "content": out["text"]}, "finish_reason": out["finish_reason"], "logprobs": _chat_logprobs(out["logprobs"])}
        return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(out)}

    return await serve_face(request, work)


async def generate_completion(state: ApiState, tenant: str, raw: dict[str, Any], internal: str) -> Any:
    """``/v1/completions`` on a ``generate`` service (``openai_face`` hands it over)."""
    body: GenerateCompletionBody = parse_body(GenerateCompletionBody, raw)
    top = body.logprobs
    call = _request(body, prompt=body.prompt, max_tokens=body.max_tokens, logprobs=top is not None or None, top_logprobs=top)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        return await _stream(state, tenant, internal, call, head, "text")
    out = await call_service(state, tenant, internal, call)
    logprobs = None
    if out["logprobs"] is not None:
        entries = out["logprobs"]
        logprobs = {
            "tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries], "text_offset": None,
        }  # fmt: skip
    choice = {"index": 0, "text": out["text"], "finish_reason": out["finish_reason"], "logprobs": logprobs}
    return {**head, "object": "text_completion", "choices": [choice], "usage": _usage(out)}


async def _stream(state: ApiState, tenant: str, internal: str, call: dict[str, Any], head: dict[str, Any], kind: str) -> StreamingResponse:
    record = submit_service(state, tenant, internal, {**call, "stream": True})
    return StreamingResponse(_chunks(state, record, head, kind), media_type="text/event-stream")


def _chunk(head: dict[str, Any], kind: str, delta: str, finish: str | None, first: bool = False) -> str:
    if kind == "chat":
        content: dict[str, Any] = {"role": "assistant", "content": delta} if first else {"content": delta}
        choice: dict[str, Any] = {"index": 0, "delta": content if (delta or first) else {}, "finish_reason": finish, "logprobs": None}
        body = {**head, "object": "chat.completion.chunk", "choices": [choice]}
    else:
        body = {**head, "object": "text_completion", "choices": [{"index": 0, "text": delta, "finish_reason": finish, "logprobs": None}]}
    return f"data: {json.dumps(body)}\n\n"


async def _chunks(state: ApiState, record: ActionRecord, head: dict[str, Any], kind: str) -> AsyncIterator[str]:
    """One chunk per token event while the replica decodes, the rest from the result."""
    sent_text, seen, finished = "", 0, False
    yield _chunk(head, kind, "", None, first=True)
    try:
        while True:
            for _stream_name, text in record.live_output[seen:]:
                try:
                    event = json.loads(text)
                except ValueError:
                    continue  # cut at the live-output cap: the result carries the rest
                if event.get("delta"):
                    sent_text += event["delta"]
                    yield _chunk(head, kind, event["delta"], None)
            seen = len(record.live_output)
            if record.done.done():
                break
            changed = record.live_output_changed
            if len(record.live_output) > seen:
                continue
            waiter = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait((record.done, state.stopping, waiter), timeout=15.0, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if state.stopping.done() and not record.done.done():
                return
        result = await read_result(record)  # held outputs (Ray) fetched
        state.ack(record)
        finished = True
        if not result.ok:
            error = {"error": {"message": f"the generation ended {result.outcome}: {result.cause}", "type": "server_error", "param": None, "code": None}}
            yield f"data: {json.dumps(error)}\n\n"
        else:
            out = result.output
            rest = out["text"][len(sent_text):] if out["text"].startswith(sent_text) else ""
            yield _chunk(head, kind, rest, out["finish_reason"])
        yield "data: [DONE]\n\n"
    finally:
        if not finished:  # the client went away mid-stream: stop decoding for it
            state.controller.cancel(record.spec.action_id)
