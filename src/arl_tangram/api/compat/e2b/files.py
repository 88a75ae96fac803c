"""Shell: envd's REST side: ``GET /health``, ``GET /files?path=`` (the file's bytes) and
``POST /files?path=`` (multipart ``file`` parts, or an ``application/octet-stream`` body:
envd 0.5.7's upload), answered ``[{"name", "type": "file", "path"}]``.

File transfers are host-side calls of the CPU manager (no CPU grant, no action; bounded,
regular files only, parents created, atomic replace), the same ones the native
``/v1/envs/{id}/files`` routes use, so they work while the sandbox is idle at zero CPU.
Errors in envd's shape ``{"code", "message"}``: 400 (a bad path), 401 (token), 404 (no such
file or sandbox), 413 past ``[service] max_file_body_bytes``.
"""

from __future__ import annotations

import asyncio
import posixpath
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from arl_tangram.api.compat.e2b.connect import HTTP_STATUS, ConnectError
from arl_tangram.api.compat.e2b.envd import as_connect, envd_sandbox
from arl_tangram.api.compat.e2b.sandboxes import E2bSandbox, E2bState
from arl_tangram.api.compat.pool import env_cpu

router = APIRouter(tags=["e2b-envd"], include_in_schema=False)


def _error(exc: Exception) -> JSONResponse:
    if isinstance(exc, IsADirectoryError | NotADirectoryError):
        exc = ConnectError("invalid_argument", str(exc))
    error = as_connect(exc)
    status = HTTP_STATUS.get(error.code, 500)
    return JSONResponse({"code": status, "message": error.message}, status)


def _path(request: Request) -> str:
    path = request.query_params.get("path", "")
    if not path:
        raise ConnectError("invalid_argument", "path: is required")
    return path


def _absolute(e2b: E2bState, sb: E2bSandbox, path: str) -> str:
    if path.startswith("/"):
        return posixpath.normpath(path)
    cwd = env_cpu(e2b.api, sb.internal).get_sandbox(sb.internal).layout.default_cwd
    return posixpath.normpath(posixpath.join(cwd, path))


@router.get("/health")
async def health(request: Request) -> Response:
    try:
        envd_sandbox(request)
    except Exception as exc:  # noqa: BLE001
        return _error(exc)
    return Response(status_code=204)


@router.get("/files")
async def read_file(request: Request) -> Response:
    try:
        e2b, sb = envd_sandbox(request)
        path = _path(request)
        data = await asyncio.to_thread(env_cpu(e2b.api, sb.internal).read_file, sb.internal, path)
    except Exception as exc:  # noqa: BLE001
        return _error(exc)
    return Response(data, media_type="application/octet-stream")


async def _parts(request: Request, path: str | None) -> list[tuple[str, bytes]]:
    """(path, bytes) of each file the upload holds."""
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != "multipart/form-data":
        if path is None:
            raise ConnectError("invalid_argument", "path: is required for an octet-stream upload")
        return [(path, await request.body())]  # bounded by the edge
    form = await request.form()
    parts: list[tuple[str, bytes]] = []
    for _, value in form.multi_items():
        if isinstance(value, str):
            continue
        target = path if path is not None and len(form) == 1 else (value.filename or "")
        if not target:
            raise ConnectError("invalid_argument", "path: each file part needs a filename, or give path=")
        parts.append((target, await value.read()))
    return parts


@router.post("/files")
async def write_files(request: Request) -> Response:
    try:
        e2b, sb = envd_sandbox(request)
        parts = await _parts(request, request.query_params.get("path") or None)
        cpu = env_cpu(e2b.api, sb.internal)
        written: list[dict[str, Any]] = []
        for path, data in parts:
            await asyncio.to_thread(cpu.write_file, sb.internal, path, data)
            full = _absolute(e2b, sb, path)
            written.append({"name": posixpath.basename(full), "type": "file", "path": full})
    except Exception as exc:  # noqa: BLE001
        return _error(exc)
    return JSONResponse(written)
