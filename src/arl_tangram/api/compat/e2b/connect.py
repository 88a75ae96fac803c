"""Shell: the Connect protocol (connectrpc.com/docs/protocol) as envd's clients speak it.

Who calls: the envd route handlers (``process``, ``filesystem``). Messages are the
protobuf classes the ``e2b`` package ships; the codec follows the request's content type:
``application/json`` / ``application/connect+json`` (the Python SDK's default: ProtoJSON)
or ``application/proto`` / ``application/connect+proto`` (binary). A unary call's body is
one bare message and its reply one bare message, an error an HTTP status with a JSON
``{"code", "message"}`` body. A stream (either direction) is a sequence of envelopes: 1
flag byte + 4-byte big-endian length + the message; a server stream always ends with an
end-stream envelope (flag 0x02) holding JSON ``{}`` or ``{"error": {...}}``, and its HTTP
status is 200 even when it ends in an error. Compression is never used (no
``Connect-Content-Encoding`` is answered).
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import Request, Response

M = TypeVar("M")
END_STREAM = 0x02
COMPRESSED = 0x01
MAX_MESSAGE_BYTES = 16 << 20  # one envelope's message, as envd bounds its own
#: HTTP status of each Connect error code on a unary call (the protocol's table)
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
    "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
    "aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}  # fmt: skip


class ConnectError(Exception):
    """An RPC failure sent as a Connect error: ``code`` is one of ``HTTP_STATUS``'s keys."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    def wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def codec_of(request: Request, *, stream: bool) -> str:
    """``json`` or ``proto`` from the content type; ``ConnectError`` for anything else."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    prefix = "application/connect+" if stream else "application/"
    name = content_type.removeprefix(prefix) if content_type.startswith(prefix) else ""
    if name not in ("json", "proto"):
        raise ConnectError("invalid_argument", f"content-type: must be {prefix}json or {prefix}proto (got {content_type!r})")
    return name


def timeout_s_of(request: Request) -> float | None:
    """The caller's deadline (``Connect-Timeout-Ms``), in seconds; None when it sets none."""
    value = request.headers.get("connect-timeout-ms")
    if value is None:
        return None
    if not value.isdigit() or len(value) > 10:
        raise ConnectError("invalid_argument", f"connect-timeout-ms: must be at most 10 digits (got {value[:16]!r})")
    return int(value) / 1000.0


def encode(message: Any, codec: str) -> bytes:
    return message.to_json().encode() if codec == "json" else bytes(message.to_binary())


def decode(data: bytes, cls: type[M], codec: str) -> M:
    try:
        if codec == "json":
            return cls.from_json(data or b"{}", ignore_unknown_fields=True)  # type: ignore[attr-defined, no-any-return]
        return cls.from_binary(data, ignore_unknown_fields=True)  # type: ignore[attr-defined, no-any-return]
    except Exception as exc:  # noqa: BLE001 - any parse failure is the caller's malformed message
        raise ConnectError("invalid_argument", f"body: must be a {cls.__name__} message ({exc})") from None


def envelope(data: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: ConnectError | None) -> bytes:
    return envelope(json.dumps({"error": error.wire()} if error else {}).encode(), END_STREAM)


async def read_envelopes(request: Request) -> AsyncIterator[bytes]:
    """The messages of a streamed request body, one per envelope, as they arrive."""
    buffer = bytearray()
    async for chunk in request.stream():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack(">BI", buffer[:5])
            if size > MAX_MESSAGE_BYTES:
                raise ConnectError("resource_exhausted", f"message: must be at most {MAX_MESSAGE_BYTES} bytes (got {size})")
            if len(buffer) < 5 + size:
                break
            data, buffer = bytes(buffer[5 : 5 + size]), buffer[5 + size :]
            if flags & COMPRESSED:
                raise ConnectError("internal", "message: compressed envelopes are not accepted (no encoding was offered)")
            yield data
    if buffer:
        raise ConnectError("invalid_argument", "body: ends inside an envelope")


async def first_envelope(request: Request) -> bytes:
    """The single message a server-streaming call sends."""
    async for data in read_envelopes(request):
        return data
    raise ConnectError("invalid_argument", "body: must hold one enveloped message")


def unary_reply(message: Any, codec: str) -> Response:
    return Response(encode(message, codec), 200, media_type=f"application/{codec}")


def unary_error(error: ConnectError) -> Response:
    body = json.dumps(error.wire())
    return Response(body, HTTP_STATUS.get(error.code, 500), media_type="application/json")


def stream_media_type(codec: str) -> str:
    return f"application/connect+{codec}"
