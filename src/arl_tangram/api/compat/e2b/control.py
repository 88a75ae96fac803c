"""Shell: the E2B control plane (``E2B_API_URL`` = ``<server><prefix>``), as ``e2b==2.63.0``
calls it: ``POST /v2/sandboxes`` (and ``/sandboxes``), ``GET /v2/sandboxes`` and
``/sandboxes``, ``GET/DELETE /sandboxes/{id}``, ``POST /sandboxes/{id}/timeout``,
``/refreshes``, ``/pause``, ``/resume``, ``/connect`` (and ``/v2/.../connect``).

Auth: ``X-API-Key`` maps to a tenant exactly like a bearer token on the native API (with
no tokens configured every key is tenant ``default``); a bad key is 401, another tenant's
sandbox 404. Errors are E2B's ``{"code": <status>, "message"}``, which the SDK turns into
``AuthenticationException`` (401), ``NotFoundException`` / ``SandboxNotFoundException``
(404), ``InvalidArgumentException``-like ``SandboxException`` (400), ``ServiceBusyException``
(503). A template is an image: ``templateID`` is an alias of ``[e2b] templates`` or an image
reference, and the metadata key ``[e2b] image_key`` (slime's ``image``) overrides it.
Metadata ``cpu`` (``"n"`` / ``"min-max"``) sets the cores of the sandbox's commands,
``memory`` (``"512MiB"``) its memory limit. Pause: the sandbox takes no new commands and its
TTL clock stops (between commands it already uses no CPU); resume takes commands again.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from arl_tangram.api.compat.e2b.fork import create_from_snapshot
from arl_tangram.api.compat.e2b.route_basics import (
    E2bError,
    check_timeout,
    e2b_route,
    read_body,
    sandbox_of,
    sandbox_view,
    str_map,
    tenant_of_key,
)  # fmt: skip
from arl_tangram.api.compat.e2b.sandboxes import E2bSandbox, E2bState, e2b_state, new_sandbox_id
from arl_tangram.core.action import EnvSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import parse_size_bytes
from arl_tangram.runtime.config_e2b import parse_cpu
from arl_tangram.runtime.controller import EnvFailedError

router = APIRouter(tags=["e2b"], include_in_schema=False)  # E2B's contract, not ours
DEFAULT_TIMEOUT_S = 15  # E2B's API default when the body sets none (the SDK sends 300)


def resolve_template(e2b: E2bState, template_id: Any, metadata: dict[str, str]) -> str:
    """The image a sandbox runs: metadata's image key, else the alias, else the reference."""
    image = metadata.get(e2b.config.image_key)
    if image:
        return image
    if not isinstance(template_id, str) or not template_id:
        raise E2bError(400, "templateID: must be a non-empty string")
    if template_id in e2b.config.templates:
        return e2b.config.templates[template_id]
    if "/" in template_id or ":" in template_id or template_id.startswith("sha256:"):
        return template_id
    aliases = ", ".join(sorted(e2b.config.templates))
    raise E2bError(400, f"templateID: must be a template alias ({aliases}) or an image reference (got {template_id!r})")


async def _create(request: Request) -> Response:
    e2b, tenant = e2b_state(request), tenant_of_key(request)
    body = await read_body(request)
    metadata, env_vars = str_map(body, "metadata"), str_map(body, "envVars")
    timeout_s = check_timeout(body, e2b, DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S
    snapshot = e2b.snapshots.get(str(body.get("templateID")))
    if snapshot is not None and snapshot.tenant == tenant:  # a snapshot is a template (fork.py)
        return await create_from_snapshot(e2b, tenant, snapshot, body, timeout_s)
    image = resolve_template(e2b, body.get("templateID"), metadata)
    try:
        cpu = parse_cpu(metadata["cpu"], "metadata.cpu") if "cpu" in metadata else e2b.config.cpu
        mem_bytes = parse_size_bytes(metadata["memory"], "metadata.memory") if "memory" in metadata else e2b.config.mem_bytes
        kind = (tenant, image, mem_bytes)
        spare = e2b.spares.take(kind) if "trajectory_id" not in metadata else None
        sandbox_id, internal = spare or await _start_env(e2b, tenant, image, mem_bytes, metadata.get("trajectory_id", ""))
    except SpecError as exc:
        raise E2bError(400, str(exc)) from None
    e2b.spares.refill(kind)
    sb = E2bSandbox(sandbox_id, tenant, internal, str(body.get("templateID") or image), image, metadata, env_vars, cpu)
    e2b.add(sb, timeout_s)
    return JSONResponse({**sandbox_view(e2b, sb), "envdAccessToken": sb.access_token}, 201)


async def _start_env(e2b: E2bState, tenant: str, image: str, mem_bytes: int, trajectory_id: str) -> tuple[str, str]:
    """A new env for a sandbox: (sandbox id, internal env id), once its sandbox runs."""
    sandbox_id = new_sandbox_id()
    internal = e2b.api.scoped(tenant, sandbox_id)
    spec = EnvSpec(internal, mem_bytes, tenant, trajectory_id, image=image)
    task = e2b.api.spawn(e2b.api.controller.create_env(spec))  # its own task: a client gone does not abandon it
    done, _ = await asyncio.wait((task,), timeout=e2b.api.create_timeout_s)
    if not done:
        e2b.api.controller.release_env(internal)
        raise E2bError(503, f"no node could place the sandbox within {e2b.api.create_timeout_s:g} s")
    try:
        task.result()
    except SpecError as exc:
        raise E2bError(400, f"templateID: {exc}") from None
    except EnvFailedError as exc:
        raise E2bError(400, f"templateID: the sandbox could not start from {image!r}: {exc}") from None
    return sandbox_id, internal


async def _list(request: Request) -> Response:
    e2b, tenant = e2b_state(request), tenant_of_key(request)
    wanted = dict(urllib.parse.parse_qsl(request.query_params.get("metadata", "")))
    states = set(filter(None, request.query_params.get("state", "").split(",")))
    out = []
    for sb in sorted(e2b.sandboxes.values(), key=lambda s: s.started_wall_s):
        view = sandbox_view(e2b, sb, detail=True)
        if sb.tenant == tenant and all(sb.metadata.get(k) == v for k, v in wanted.items()) and (not states or view["state"] in states):
            out.append(view)
    return JSONResponse(out)


async def _get(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    return JSONResponse({**sandbox_view(e2b, sb, detail=True), "envdAccessToken": sb.access_token})


async def _delete(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    e2b.kill(sb, "was killed by its owner")
    return Response(status_code=204)


async def _set_timeout(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    timeout_s = check_timeout(await read_body(request), e2b, None)
    if timeout_s is None:
        raise E2bError(400, "timeout: is required")
    if sb.paused:
        sb.left_s = float(timeout_s)
    else:
        e2b.arm(sb, timeout_s)
    return Response(status_code=204)


async def _refresh(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    duration = (await read_body(request)).get("duration", DEFAULT_TIMEOUT_S)
    if not isinstance(duration, int) or isinstance(duration, bool) or not 0 <= duration <= e2b.config.max_timeout_s:
        raise E2bError(400, f"duration: must be an integer number of seconds in [0, {e2b.config.max_timeout_s}]")
    if not sb.paused and sb.end_s - time.monotonic() < duration:
        e2b.arm(sb, duration)
    return Response(status_code=204)


async def _pause(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    if sb.paused:
        raise E2bError(409, f"sandbox {sandbox_id!r} is already paused")
    e2b.pause(sb)
    return Response(status_code=204)


async def _resume(request: Request, sandbox_id: str, *, connect: bool) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    timeout_s = check_timeout(await read_body(request), e2b, None)
    if not sb.paused:
        if not connect:
            raise E2bError(409, f"sandbox {sandbox_id!r} is not paused")
        if timeout_s is not None and sb.end_s - time.monotonic() < timeout_s:
            e2b.arm(sb, timeout_s)  # E2B's connect extends, never shortens
        return JSONResponse({**sandbox_view(e2b, sb), "envdAccessToken": sb.access_token}, 200)
    e2b.arm(sb, timeout_s if timeout_s is not None else (sb.left_s or DEFAULT_TIMEOUT_S))
    return JSONResponse({**sandbox_view(e2b, sb), "envdAccessToken": sb.access_token}, 201)


async def _connect(request: Request, sandbox_id: str) -> Response:
    return await _resume(request, sandbox_id, connect=True)


async def _resume_only(request: Request, sandbox_id: str) -> Response:
    return await _resume(request, sandbox_id, connect=False)


for path in ("/sandboxes", "/v2/sandboxes"):
    router.add_api_route(path, e2b_route(_create), methods=["POST"])
    router.add_api_route(path, e2b_route(_list), methods=["GET"])
    router.add_api_route(path + "/{sandbox_id}/connect", e2b_route(_connect), methods=["POST"])
router.add_api_route("/sandboxes/{sandbox_id}", e2b_route(_get), methods=["GET"])
router.add_api_route("/sandboxes/{sandbox_id}", e2b_route(_delete), methods=["DELETE"])
router.add_api_route("/sandboxes/{sandbox_id}/timeout", e2b_route(_set_timeout), methods=["POST"])
router.add_api_route("/sandboxes/{sandbox_id}/refreshes", e2b_route(_refresh), methods=["POST"])
router.add_api_route("/sandboxes/{sandbox_id}/pause", e2b_route(_pause), methods=["POST"])
router.add_api_route("/sandboxes/{sandbox_id}/resume", e2b_route(_resume_only), methods=["POST"])
