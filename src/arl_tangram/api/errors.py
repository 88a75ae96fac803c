"""Shell: how failures become HTTP answers; every error body is ``ErrorBody`` (field, rule).

- invalid input (pydantic, the core's ``SpecError``, ``ConfigError``, a manager's
  ``InvalidRequestError``): 422 naming the field and the rule;
- an operator's power a tenant was not granted (``registration.Forbidden``): 403 naming the
  field and the rule;
- an id the tenant does not own: 404 (never 403, so ids are not confirmed); the tenant's own
  env whose lease ran out: 410 saying so;
- a per-tenant limit (``TenantLimitError``): 429; a full queue (``Overloaded`` here, the
  runtime's ``OverloadedError``) or a service shutting down: 503; both with ``Retry-After``;
- input that is well-formed but that the target's state refuses (a duplicate id, a
  directory where a file must be, no such directory, a full workspace): 409 naming the
  field; a file call's OS error: the path named, 404 (no such file) or 409;
- a body past its cap: 413 (``api.edge``); a method the path does not take: 405 with
  ``Allow`` listing the methods it does take;
- a duplicate name: 409; anything else: 500, logged, without internals in the body (the
  edge answers what no handler here did, so no exception reaches uvicorn).
The runtime's error classes are matched by name and ``retry_after_s`` so the API works
before and after they exist.
"""

from __future__ import annotations

import errno
import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from arl_tangram.api.edge import BodyTooLarge
from arl_tangram.api.registration import Forbidden
from arl_tangram.api.state import Gone, NotFound, Overloaded
from arl_tangram.core.errors import SpecError
from arl_tangram.managers.gpu.errors import GpuManagerError
from arl_tangram.runtime.controller import EnvFailedError

log = logging.getLogger(__name__)


def error_response(
    status: int, error: str, field: str = "", rule: str = "", value: Any = None, *, retry_after_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:  # fmt: skip
    body = {"error": error, "field": field, "rule": rule, "value": _jsonable(value)}
    headers = dict(headers or {})
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return JSONResponse(body, status_code=status, headers=headers)


def _jsonable(value: Any) -> Any:
    # bounded before any copy: the value may be a 100 MB string or a list of millions
    if isinstance(value, str):
        return value[:200]
    if value is None or isinstance(value, bool | int | float):
        return value if not isinstance(value, float) or math.isfinite(value) else repr(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value[:32]]
    if isinstance(value, bytes | bytearray):
        return repr(bytes(value[:200]))
    if isinstance(value, dict):
        return f"<an object of {len(value)} keys>"
    return repr(value)[:200]


# pydantic puts the union member it tried in the error's path ("command.constrained-str")
_TYPE_TAG = re.compile(r"^(constrained-\w+|function-\w+\[.*|str|int|float|bool|list\[.*|dict\[.*|literal\[.*|nullable\[.*)$")
_ACTION_TYPES = ("exec", "code", "service", "api", "noop")


def _loc(loc: tuple[Any, ...]) -> str:
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):  # where, not which
        loc = loc[1:]
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in _ACTION_TYPES:  # the discriminated union's chosen member
        parts = parts[1:]
    return ".".join(p for p in parts if not _TYPE_TAG.match(p)) or (parts[0] if parts else "body")


async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first: dict[str, Any] = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request", "input": None}
    field = _loc(tuple(first.get("loc") or ()))
    if first.get("type") in ("union_tag_invalid", "union_tag_not_found"):  # the action's "type"
        rule = str(first.get("msg", "invalid"))
        ctx = first.get("ctx")
        return error_response(422, f"type: {rule}", "type", rule, ctx.get("tag") if isinstance(ctx, dict) else None)
    # a union field fails once per member: say every way it could have been right
    rules = dict.fromkeys(str(e.get("msg", "invalid")) for e in errors if _loc(tuple(e.get("loc") or ())) == field)
    rule = " or ".join(rules) or str(first.get("msg", "invalid"))
    response = error_response(422, f"{field}: {rule}", field, rule, first.get("input"))
    return response


async def _spec_error(_request: Request, exc: Exception) -> JSONResponse:
    field, rule = getattr(exc, "field", ""), getattr(exc, "rule", str(exc))
    value = getattr(exc, "value", None)
    retry_after_s = getattr(exc, "retry_after_s", None)
    if type(exc).__name__ in ("ConflictError", "Conflict"):  # the target's state, not the input's shape
        return error_response(409, str(exc), field, rule, value)
    if type(exc).__name__ == "TenantLimitError":
        _count_refusal(_request, 429)
        return error_response(429, str(exc), field, rule, value, retry_after_s=retry_after_s or 1.0)
    return error_response(422, str(exc), field, rule, value)


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, NotFound)
    return error_response(404, str(exc), exc.field, "must name one of this tenant's live objects", exc.value)


async def _forbidden(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Forbidden)
    return error_response(403, str(exc), exc.field, exc.rule, exc.value)


async def _gone(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Gone)
    return error_response(410, str(exc), exc.field, exc.rule, exc.value)


def _count_refusal(request: Request, status: int) -> None:
    api = getattr(request.app.state, "api", None)
    if api is not None:
        api.metrics.rejected.labels(str(status)).inc()


async def _overloaded(_request: Request, exc: Exception) -> JSONResponse:
    _count_refusal(_request, 503)
    rule = getattr(exc, "rule", None) or str(exc)
    return error_response(503, f"overloaded: {rule}", "", rule, retry_after_s=getattr(exc, "retry_after_s", None) or 1.0)


async def _env_failed(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, str(exc), "env", "the sandbox must start", retry_after_s=1.0)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if isinstance(exc, BodyTooLarge):
        return error_response(413, str(exc.detail), "body", f"must be at most {exc.cap_bytes} bytes ({exc.setting})")
    if exc.status_code == 405:
        allowed = _allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        return error_response(405, str(exc.detail), "method", f"must be one of {', '.join(allowed)}", request.method, headers=headers)
    return error_response(exc.status_code, str(exc.detail), headers=headers)


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of this path takes (Starlette names only the first route's)."""
    routes = request.app.router.routes
    return [m for m in _METHODS if any(r.matches({**request.scope, "method": m})[0] is Match.FULL for r in routes)]


# errno -> (status, rule) of a file call's OS error: the tenant's own path, never a 500
_FILE_ERRNO = {
    errno.ENOENT: (404, "must name an existing file (or a directory to create it in)"),
    errno.EISDIR: (409, "must name a regular file, not a directory"),
    errno.ENOTDIR: (409, "must not pass through a non-directory"),
    errno.ELOOP: (409, "must not pass through a symlink"),
    errno.EROFS: (409, "must name a file below /workspace or /tmp (not a read-only place)"),
    errno.EACCES: (409, "must name a file the sandbox user may access"),
    errno.EPERM: (409, "must name a file the sandbox user may access"),
    errno.ENOSPC: (409, "must fit the sandbox's free space"),
    errno.ENAMETOOLONG: (422, "must have components of at most 255 bytes"),
}


async def _os_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OSError)
    known = _FILE_ERRNO.get(exc.errno or 0) or _FILE_ERRNO.get(getattr(exc.__cause__, "errno", 0) or 0)
    if known is None:
        return await _other(request, exc)
    status, rule = known
    path = request.query_params.get("path")
    return error_response(status, f"path: {rule}", "path", rule, path)


async def _other(request: Request, exc: Exception) -> JSONResponse:
    """Manager errors by their shape; the rest is a bug or an infrastructure failure (500)."""
    name = type(exc).__name__
    if name == "OverloadedError" or (getattr(exc, "retry_after_s", None) is not None and not isinstance(exc, SpecError)):
        return await _overloaded(request, exc)
    if hasattr(exc, "field") and hasattr(exc, "rule"):
        return await _spec_error(request, exc)
    if name == "DuplicateServiceError":
        return error_response(409, str(exc), "name", "must not name a registered service")
    if isinstance(exc, KeyError) or name in ("SandboxNotFoundError", "UnknownServiceError"):
        return error_response(404, str(exc), "", "must name a live object")
    if isinstance(exc, ValueError) or name == "NeverFitsError":
        return error_response(422, str(exc), "", str(exc))
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error: {name}")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(SpecError, _spec_error)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(Gone, _gone)
    app.add_exception_handler(Forbidden, _forbidden)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(EnvFailedError, _env_failed)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OSError, _os_error)
    # By class, so Starlette's exception middleware answers them; an ``Exception`` handler
    # would be called from the outermost middleware, which then re-raises (uvicorn logs a
    # traceback and drops the connection): what no class here matches, the edge answers.
    for cls in (ValueError, LookupError, RuntimeError, ArithmeticError, GpuManagerError):
        app.add_exception_handler(cls, _other)
