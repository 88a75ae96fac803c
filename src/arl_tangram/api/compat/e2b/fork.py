"""Shell: E2B's fork and snapshots over the runtime's own snapshot/fork (the fork issue's
SDK surface: ``env.snapshot(name)``, ``env.fork(n)``, ``client.create_env(snapshot=)``).

``POST /sandboxes/{id}/fork {timeout, count}`` -> 201 ``[{"sandbox": {...}} | {"error":
{code, message}}]``, one entry per child (children are scheduled forks: a child costs a
fresh writable layer on the parent's snapshot, placed on the parent's node);
``POST /sandboxes/{id}/snapshots {name}`` -> 201 ``{"snapshotID", "names"}``; ``GET
/snapshots`` lists the tenant's; ``DELETE /templates/{snapshotID}`` drops one; a snapshot id
is a template: ``POST /v2/sandboxes {"templateID": <snapshotID>}`` starts a sandbox from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from arl_tangram.api.compat.e2b.route_basics import (
    E2bError,
    check_timeout,
    e2b_route,
    read_body,
    sandbox_of,
    sandbox_view,
    tenant_of_key,
)  # fmt: skip
from arl_tangram.api.compat.e2b.sandboxes import E2bSandbox, E2bState, e2b_state, new_sandbox_id
from arl_tangram.client.client import AsyncClient, Env
from arl_tangram.client.transport import InProcessTransport

router = APIRouter(tags=["e2b"], include_in_schema=False)
MAX_FORKS = 100  # E2B's bound on one fork call


@dataclass
class E2bSnapshot:
    snapshot_id: str
    tenant: str
    names: list[str]
    handle: Any  # the runtime's Snapshot


def _env(e2b: E2bState, sb: E2bSandbox) -> Any:
    """The SDK's handle on the sandbox's env, in process (never closed: the runtime is the server's)."""
    client = AsyncClient(InProcessTransport(e2b.api.runtime), tenant=sb.tenant)
    return Env(client, sb.internal, "")


def _child(e2b: E2bState, parent: E2bSandbox, env: Any, timeout_s: int) -> dict[str, Any]:
    sandbox_id = new_sandbox_id()
    sb = E2bSandbox(sandbox_id, parent.tenant, env.env_id, parent.template_id, parent.image, dict(parent.metadata), dict(parent.env_vars), parent.cpu)
    e2b.add(sb, timeout_s)
    return {**sandbox_view(e2b, sb), "envdAccessToken": sb.access_token}


async def _fork(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    body = await read_body(request)
    count = body.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_FORKS:
        raise E2bError(400, f"count: must be an integer in [1, {MAX_FORKS}] (got {count!r})")
    timeout_s = check_timeout(body, e2b, None) or max(1, int(sb.end_wall_s() - sb.started_wall_s))
    children = await _env(e2b, sb).fork(count)
    return JSONResponse([{"sandbox": _child(e2b, sb, c, timeout_s)} for c in children], 201)


async def _snapshot(request: Request, sandbox_id: str) -> Response:
    e2b, sb = sandbox_of(request, sandbox_id)
    name = (await read_body(request)).get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise E2bError(400, "name: must be a non-empty string")
    snap = await _env(e2b, sb).snapshot(name=name)
    entry = E2bSnapshot(str(snap.snapshot_id), sb.tenant, [name] if name else [], snap)
    e2b.snapshots[entry.snapshot_id] = entry
    return JSONResponse({"snapshotID": entry.snapshot_id, "names": entry.names}, 201)


async def _list(request: Request) -> Response:
    e2b, tenant = e2b_state(request), tenant_of_key(request)
    mine = [s for s in e2b.snapshots.values() if s.tenant == tenant]
    return JSONResponse([{"snapshotID": s.snapshot_id, "names": s.names} for s in sorted(mine, key=lambda s: s.snapshot_id)])


async def _delete(request: Request, template_id: str) -> Response:
    e2b, tenant = e2b_state(request), tenant_of_key(request)
    entry = e2b.snapshots.get(template_id)
    if entry is None or entry.tenant != tenant:
        raise E2bError(404, f"template {template_id!r} not found")
    client = AsyncClient(InProcessTransport(e2b.api.runtime), tenant=tenant)
    await client.delete_snapshot(entry.handle)
    del e2b.snapshots[template_id]
    return Response(status_code=204)


async def create_from_snapshot(e2b: E2bState, tenant: str, entry: Any, body: dict[str, Any], timeout_s: int) -> Response:
    """``POST /v2/sandboxes`` whose ``templateID`` is one of the tenant's snapshots."""
    client = AsyncClient(InProcessTransport(e2b.api.runtime), tenant=tenant)
    env = await client.create_env(snapshot=entry.handle, memory=e2b.config.mem_bytes)
    metadata = {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}
    env_vars = {str(k): str(v) for k, v in (body.get("envVars") or {}).items()}
    sb = E2bSandbox(new_sandbox_id(), tenant, env.env_id, entry.snapshot_id, "snapshot", metadata, env_vars, e2b.config.cpu)
    e2b.add(sb, timeout_s)
    return JSONResponse({**sandbox_view(e2b, sb), "envdAccessToken": sb.access_token}, 201)


router.add_api_route("/sandboxes/{sandbox_id}/fork", e2b_route(_fork), methods=["POST"])
router.add_api_route("/sandboxes/{sandbox_id}/snapshots", e2b_route(_snapshot), methods=["POST"])
router.add_api_route("/snapshots", e2b_route(_list), methods=["GET"])
router.add_api_route("/templates/{template_id}", e2b_route(_delete), methods=["DELETE"])
