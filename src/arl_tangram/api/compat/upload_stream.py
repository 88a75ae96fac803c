"""Shell: a multipart upload (SWE-ReX's ``/upload``) read as it arrives, its file part
streamed into the env's sandbox.

Who calls: ``swerex.upload``, after the caller's key and env were checked. The file part's
bytes go straight to a ``Spool`` in the sandbox's own /tmp (``managers.cpu.spool``), in
batches of about ``BATCH_BYTES`` on worker threads: nothing is held whole in memory or
written to the host's disk. The small fields (``target_path``, ``unzip``) are kept, at most
``MAX_FIELD_BYTES`` each. The body itself is bounded by the edge (``max_upload_bytes``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from arl_tangram.core.errors import SpecError

BATCH_BYTES = 1 << 20
MAX_FIELD_BYTES = 4096


@dataclass
class _Parts:
    """What the parser's callbacks saw since the last drain."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    header_name: bytes = b""
    header_value: bytes = b""
    name: str = ""
    events: list[tuple[str, bytes]] = field(default_factory=list)  # (part name, data)

    def callbacks(self) -> dict[str, Any]:
        def header_field(data: bytes, start: int, end: int) -> None:
            self.header_name += data[start:end]

        def header_value(data: bytes, start: int, end: int) -> None:
            self.header_value += data[start:end]

        def header_end() -> None:
            self.headers.append((self.header_name.lower(), self.header_value))
            self.header_name = self.header_value = b""

        def headers_finished() -> None:
            disposition = dict(self.headers).get(b"content-disposition", b"")
            _, options = parse_options_header(disposition)
            self.name = options.get(b"name", b"").decode("utf-8", "replace")
            self.headers = []

        def part_data(data: bytes, start: int, end: int) -> None:
            self.events.append((self.name, bytes(data[start:end])))

        return {
            "on_header_field": header_field, "on_header_value": header_value, "on_header_end": header_end,
            "on_headers_finished": headers_finished, "on_part_data": part_data,
        }  # fmt: skip


async def receive_upload(request: Request, spool: Any) -> dict[str, str]:
    """Read the form: the ``file`` part into ``spool`` (its ``write`` runs on worker
    threads), the other fields returned by name. 422 naming the rule when it is not a form.

    A refusal met mid-body (the spool is full, a field too long) is raised only after the
    rest of the body was read and dropped: a server that answers while the client is still
    sending resets the connection, and the client sees a reset instead of the refusal. The
    drain is bounded by the edge (``max_upload_bytes``) like the body itself."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise SpecError("content-type", "must be multipart/form-data with a boundary", request.headers.get("content-type"))
    parts = _Parts()
    parser = MultipartParser(boundary, parts.callbacks())  # type: ignore[arg-type]
    fields: dict[str, bytearray] = {}
    pending: list[bytes] = []
    pending_bytes = 0
    refusal: Exception | None = None
    async for chunk in request.stream():
        if refusal is not None:
            continue  # drained, see above
        try:
            parser.write(chunk)
            pending_bytes += _sort_events(parts, fields, pending)
            if pending_bytes >= BATCH_BYTES:
                await asyncio.to_thread(spool.write, b"".join(pending))
                pending, pending_bytes = [], 0
        except Exception as exc:  # noqa: BLE001 - re-raised once the body is drained
            refusal = exc
    if refusal is not None:
        raise refusal
    parser.finalize()
    if pending:
        await asyncio.to_thread(spool.write, b"".join(pending))
    return {name: bytes(value).decode("utf-8", "replace") for name, value in fields.items()}


def _sort_events(parts: _Parts, fields: dict[str, bytearray], pending: list[bytes]) -> int:
    """Move what the parser saw: file data to ``pending`` (returns its size), small fields
    into ``fields`` (``SpecError`` past ``MAX_FIELD_BYTES``)."""
    added = 0
    for name, data in parts.events:
        if name == "file":
            pending.append(data)
            added += len(data)
        else:
            value = fields.setdefault(name, bytearray())
            value += data
            if len(value) > MAX_FIELD_BYTES:
                raise SpecError(name, f"must be at most {MAX_FIELD_BYTES} bytes", len(value))
    parts.events.clear()
    return added
