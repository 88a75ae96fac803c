"""Shell: what every E2B route shares: E2B's error shape (``{"code", "message"}``), the
tenant of an ``X-API-Key``, a sandbox of that tenant by id (else 404), a JSON object body,
``timeout`` checked against the face's bound, and a sandbox's E2B view.

``control`` (lifecycle) and ``fork`` (fork and snapshots) both build on it.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from arl_tangram.api.compat.e2b.sandboxes import E2bSandbox, E2bState, e2b_state
from arl_tangram.api.compat.tenancy import Unauthorized, tenant_for
from arl_tangram.api.state import DEFAULT_TENANT, Overloaded

ENVD_VERSION = "0.5.7"  # stdin flag, default user, close stdin, octet-stream uploads; no file metadata
CLIENT_ID = "arl-tangram"


class E2bError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message

    def response(self) -> JSONResponse:
        return JSONResponse({"code": self.status, "message": self.message}, self.status)


def tenant_of_key(request: Request) -> str:
    state = e2b_state(request).api
    if not state.tokens:
        return DEFAULT_TENANT
    try:
        return tenant_for(state, request.headers.get("x-api-key") or None)
    except Unauthorized as exc:
        raise E2bError(401, f"Invalid API key: {exc}") from None


def sandbox_of(request: Request, sandbox_id: str) -> tuple[E2bState, E2bSandbox]:
    e2b = e2b_state(request)
    sb = e2b.of_tenant(tenant_of_key(request), sandbox_id)
    if sb is None:
        raise E2bError(404, f"sandbox {sandbox_id!r} not found: it {e2b.why_gone(sandbox_id)}")
    return e2b, sb


async def read_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise E2bError(400, "body: must be JSON") from None
    if not isinstance(body, dict):
        raise E2bError(400, "body: must be a JSON object")
    return body


def str_map(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise E2bError(400, f"{key}: must be an object of string values")
    return dict(value)


def check_timeout(body: dict[str, Any], e2b: E2bState, default: int | None) -> int | None:
    value = body.get("timeout", default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= e2b.config.max_timeout_s:
        raise E2bError(400, f"timeout: must be an integer number of seconds in [1, {e2b.config.max_timeout_s}] (got {value!r})")
    return value


def sandbox_view(e2b: E2bState, sb: E2bSandbox, *, detail: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "templateID": sb.template_id, "sandboxID": sb.sandbox_id, "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION, "domain": e2b.config.domain,
    }  # fmt: skip
    if detail:
        spec = e2b.api.controller.env_specs.get(sb.internal)
        out.update(
            startedAt=_iso(sb.started_wall_s), endAt=_iso(sb.end_wall_s()), cpuCount=sb.cpu[1],
            memoryMB=(spec.mem_bytes >> 20) if spec else 0, diskSizeMB=(spec.writable_bytes >> 20) if spec else 0,
            state="paused" if sb.paused else "running", metadata=sb.metadata,
        )  # fmt: skip
    return out


def _iso(wall_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall_s)) + f".{int(wall_s % 1 * 1000):03d}Z"


def e2b_route(handler: Any) -> Any:
    """The handler with E2B's error shape for every failure it names."""

    @functools.wraps(handler)
    async def route(request: Request, **kwargs: Any) -> Response:
        try:
            response: Response = await handler(request, **kwargs)
            return response
        except E2bError as exc:
            return exc.response()
        except Overloaded as exc:
            return JSONResponse({"code": 503, "message": exc.rule}, 503, headers={"Retry-After": f"{exc.retry_after_s:g}"})

    return route
