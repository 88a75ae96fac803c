"""Shell: the app's edge, an ASGI middleware every HTTP request passes before any route.

In order, for each request:
  1. a request that carries a body (a ``Content-Length`` above 0, or chunked) and no known
     credential for its face is answered 401 before one byte of its body is read (the
     credential rules: ``credentials``);
  2. a declared ``Content-Length`` over the route's cap (``BodyLimits``) is answered 413
     unread; a chunked body is counted as it is read and cut off with 413 at the cap;
  3. no exception leaves the app: one that no handler answered is logged here (with its
     traceback, in the server's log only) and answered 500 ``internal error: <class>``, so
     uvicorn never drops the keep-alive connection nor prints the error to the client.

``BodyMeter.bytes_read`` counts every body byte the app read (tests and the bench read it:
"refused after at most 64 KiB" is measured there, not in socket buffers). The limits are
read per request from ``app.state.api.body_limits`` (set when the runtime starts).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException

from arl_tangram.api.credentials import has_credential

log = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_FILE_BODY_BYTES = 64 << 20  # the CPU manager's default max_file_bytes: a larger file is never written
DEFAULT_MAX_UPLOAD_BYTES = 256 << 20


@dataclass(frozen=True)
class BodyLimits:
    """Body caps in bytes: ``file_bytes`` for ``PUT /v1/envs/<id>/files``, ``upload_bytes``
    for ``/swerex/<id>/upload``, ``body_bytes`` for every other route (JSON)."""

    body_bytes: int = DEFAULT_MAX_BODY_BYTES
    file_bytes: int = DEFAULT_MAX_FILE_BODY_BYTES
    upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES

    def cap_for(self, method: str, path: str) -> tuple[int, str]:
        """(cap, the setting that names it) for a request."""
        if method == "PUT" and path.startswith("/v1/envs/") and path.endswith("/files"):
            return self.file_bytes, "service.max_file_body_bytes"
        if path.startswith("/swerex/") and path.endswith("/upload"):
            return self.upload_bytes, "service.max_upload_bytes"
        return self.body_bytes, "service.max_body_bytes"


class BodyTooLarge(HTTPException):
    """A body past its route's cap (raised from ``receive``: FastAPI re-raises HTTP errors
    met while reading a body, so it reaches the 413 handler, not a 400)."""

    def __init__(self, cap_bytes: int, setting: str) -> None:
        super().__init__(413, f"body: must be at most {cap_bytes} bytes ({setting})")
        self.cap_bytes, self.setting = cap_bytes, setting


class BodyMeter:
    """What the edge saw: body bytes read by the app, requests refused unread."""

    def __init__(self) -> None:
        self.bytes_read = 0
        self.refused_unread = 0


class Edge:
    """The ASGI middleware (added by ``create_app`` just inside Starlette's error middleware)."""

    def __init__(self, app: Any, meter: BodyMeter) -> None:
        self.app, self.meter = app, meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = getattr(scope["app"].state, "api", None)
        limits: BodyLimits = getattr(api, "body_limits", None) or BodyLimits()
        cap, setting = limits.cap_for(scope["method"], scope["path"])
        refusal = _refusal(scope, api, cap, setting)
        if refusal is not None:
            self.meter.refused_unread += 1
            await _answer(send, *refusal)
            return
        started = False
        read = 0

        async def counted() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                self.meter.bytes_read += len(message.get("body", b""))
                if read > cap:
                    raise BodyTooLarge(cap, setting)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except Exception as exc:  # noqa: BLE001 - the last line: nothing reaches uvicorn
            if isinstance(exc, BodyTooLarge):
                answer = (413, _error(str(exc.detail), "body", f"must be at most {exc.cap_bytes} bytes ({exc.setting})"))
            else:
                log.exception("unhandled error in %s %s", scope["method"], scope["path"], exc_info=exc)
                answer = (500, _error(f"internal error: {type(exc).__name__}"))
            if not started:
                await _answer(send, *answer)


def _refusal(scope: Scope, api: Any, cap: int, setting: str) -> tuple[int, dict[str, Any], dict[str, str]] | None:
    """The answer to give before reading anything, or None to go on."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    length_text = headers.get("content-length")
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    try:
        length = int(length_text) if length_text is not None else 0
    except ValueError:
        return 400, _error("content-length: must be an integer", "content-length", "must be an integer"), {}
    if (length > 0 or chunked) and api is not None and not has_credential(api, scope["path"], headers):
        body = _error("a valid credential is required before a body is read", "authorization", "must carry this face's token")
        return 401, body, {"WWW-Authenticate": "Bearer"}
    if length > cap:
        return 413, _error(f"body: must be at most {cap} bytes ({setting})", "body", f"must be at most {cap} bytes ({setting})", length), {}
    return None


def _error(error: str, field: str = "", rule: str = "", value: Any = None) -> dict[str, Any]:
    return {"error": error, "field": field, "rule": rule, "value": value}


async def _answer(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    # The body is left unread: what the client still sends after a complete answer is
    # dropped by the server, never handed to the app (an unauthenticated upload stays unread).
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
