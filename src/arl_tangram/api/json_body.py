"""Shell: reading JSON request bodies without stalling the event loop.

A body's size is bounded first (the edge's caps, 413). A small body (up to
``SMALL_BODY_BYTES``) is parsed on the loop: that costs well under a millisecond. A larger
one is streamed, chunk by chunk as it arrives, to a JSON worker process
(``api.json_worker``) and the value comes back as small frames, each applied between the
loop's other work: the loop never holds the interpreter lock for longer than one frame
(about 128 KiB of values). The exception is a single string longer than a frame, whose
pieces are joined once at the end: one copy of that string's size.

Rules, both paths: valid JSON (422 ``body: must be valid JSON``), nested at most
``MAX_DEPTH`` levels (422), object keys at most a frame long. ``JsonWorkers`` is owned by
the app (``app.state.json_workers``), started lazily, closed with the app (its processes
killed by PID and reaped).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import pickle
import struct
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from arl_tangram.api import json_worker
from arl_tangram.core.errors import SpecError

SMALL_BODY_BYTES = 256 << 10
MAX_DEPTH = json_worker.MAX_DEPTH
_LEN = struct.Struct(">I")
_PLACEHOLDER = b"<parsed by api.json_body>"


class _NoGlobals(pickle.Unpickler):
    """JSON values need no classes: a frame naming one is refused, whoever wrote it."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a JSON frame must not name {module}.{name}")


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def parse(self, chunks: AsyncIterator[bytes]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        async for chunk in chunks:
            if chunk:
                self.proc.stdin.write(_LEN.pack(len(chunk)) + chunk)
                await self.proc.stdin.drain()
        self.proc.stdin.write(_LEN.pack(0))
        await self.proc.stdin.drain()
        builder = _Builder()
        while True:
            (n,) = _LEN.unpack(await self.proc.stdout.readexactly(4))
            ops = _NoGlobals(io.BytesIO(await self.proc.stdout.readexactly(n))).load()
            if builder.apply(ops):
                return builder.result


class JsonWorkers:
    """A few JSON worker processes; a body holds one for its parse."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._free = asyncio.Semaphore(size)
        self.num_parsed = 0

    async def parse(self, chunks: AsyncIterator[bytes]) -> Any:
        async with self._free:
            worker = self._idle.pop() if self._idle else await self._start()
            try:
                value = await worker.parse(chunks)
            except BaseException:
                await self._kill(worker)  # mid-body (a client gone, a bad frame): start afresh
                raise
            self._idle.append(worker)
            self.num_parsed += 1
            return value

    async def _start(self) -> _Worker:
        script = str(Path(json_worker.__file__).resolve())
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", script, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        worker = _Worker(proc)
        self._all.add(worker)
        return worker

    async def _kill(self, worker: _Worker) -> None:
        self._all.discard(worker)
        with contextlib.suppress(ProcessLookupError):
            worker.proc.kill()
        await worker.proc.wait()

    async def aclose(self) -> None:
        for worker in list(self._all):
            await self._kill(worker)
        self._idle.clear()


class _Builder:
    """Applies a worker's ops (see ``api.json_worker``); ``apply`` says when it is done."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [container or string pieces, kind, pending key]
        self.result: Any = None

    def _attach(self, value: Any) -> None:
        if not self.stack:
            self.result = value
            return
        top = self.stack[-1]
        if top[1] == "[":
            top[0].append(value)
        else:
            top[0][top[2]] = value

    def apply(self, ops: list[tuple[Any, ...]]) -> bool:
        for op in ops:
            code = op[0]
            if code == "v":
                self._attach(op[1])
            elif code in ("[", "{", '"'):
                self.stack.append([[] if code != "{" else {}, code, None])
            elif code == "x" or code == "s":
                self.stack[-1][0].extend(op[1]) if code == "x" else self.stack[-1][0].append(op[1])
            elif code == "u":
                self.stack[-1][0].update(op[1])
            elif code == "k":
                self.stack[-1][2] = op[1]
            elif code == "]":
                container, kind, _ = self.stack.pop()
                self._attach("".join(container) if kind == '"' else container)
            elif code == "error":
                raise SpecError("body", op[1])
            elif code == "done":
                return True
        return False


def _workers(request: Request) -> JsonWorkers:
    workers: JsonWorkers = request.app.state.json_workers  # created and closed by create_app
    return workers


def parse_small(raw: bytes) -> Any:
    """A small body's value on the caller's thread, under the same rules as the worker's."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise SpecError("body", f"must nest at most {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise SpecError("body", f"must be valid JSON ({exc})"[:300]) from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:  # only then can it be too deep
        try:
            json_worker.weigh(value, 1, {})
        except json_worker.Refused as exc:
            raise SpecError("body", str(exc)) from None
    return value


async def read_json(request: Request) -> Any:
    """The request body's JSON value (cached on the request, as Starlette's ``json()``)."""
    if hasattr(request, "_json"):
        return request._json
    chunks = request.stream().__aiter__()
    head: list[bytes] = []
    size = 0
    async for chunk in chunks:
        head.append(chunk)
        size += len(chunk)
        if size > SMALL_BODY_BYTES:
            break
    if size <= SMALL_BODY_BYTES:
        request._body = b"".join(head)
        value = parse_small(request._body)
    else:

        async def rest() -> AsyncIterator[bytes]:
            for chunk in head:
                yield chunk
            async for chunk in chunks:
                yield chunk

        value = await _workers(request).parse(rest())
        request._body = _PLACEHOLDER  # FastAPI asks for the bytes before the value
    request._json = value
    return value


def _is_json(content_type: str | None) -> bool:
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


class JsonBodyRoute(APIRoute):
    """A route whose JSON body model is filled through ``read_json`` (FastAPI would parse
    it on the loop in one call): every router of the app uses it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def route(request: Request) -> Response:
            if _is_json(request.headers.get("content-type")):
                await read_json(request)
            return await handler(request)

        return route
