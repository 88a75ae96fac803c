"""Shell: the service itself: ``/v1/health`` (no token needed), ``/v1/status`` and ``/metrics``."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request, Response

from arl_tangram import __version__
from arl_tangram.api.auth import State, Tenant, tenant_of
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.metrics import CONTENT_TYPE, take_snapshot
from arl_tangram.api.schemas import ERROR_RESPONSES, Health, StatusView

router = APIRouter(tags=["service"], route_class=JsonBodyRoute)


@router.get("/v1/health", response_model=Health)
async def health(request: Request) -> dict[str, Any]:
    """Liveness: answers while the server runs (``closing`` once shutdown began)."""
    return {"status": "closing" if request.app.state.api.closing else "ok", "version": __version__}


@router.get("/v1/status", response_model=StatusView, responses=ERROR_RESPONSES)
async def status(state: State, tenant: Tenant) -> dict[str, Any]:
    """Pools, queue per lane, sandboxes by state, the services and providers the caller may use."""
    snap = take_snapshot(state.runtime)
    return {
        "tenant": tenant,
        "queue": snap["queue"],
        "pools": snap["pools"],
        "sandboxes": snap["sandboxes"],
        "services": [external for external, _i, _s in state.services_of(tenant)],
        "providers": sorted(snap["providers"]),
        "num_envs": len(state.envs_of(tenant)),
        "num_pending_actions": len(state.pending),
        "max_queued_actions": state.max_queued_actions,
        "memory": snap["memory"],
    }


async def _metrics_reader(request: Request) -> str | None:
    """Whose series the caller may read: None (all) for the operator's metrics token or on a
    server without tokens; else the caller's tenant (401 without a known token)."""
    state = request.app.state.api
    operator = state.metrics.operator_token
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if operator and scheme.lower() == "bearer" and hmac.compare_digest(operator.encode(), given.strip().encode()):
        return None
    if not state.tokens:
        return None
    return await tenant_of(request)


@router.get("/metrics", responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format"}, **ERROR_RESPONSES})
async def metrics(request: Request, state: State) -> Response:
    """Prometheus metrics of this server: a tenant's token shows that tenant's series (and
    the shared service's); the operator's ``metrics_token`` shows every tenant's."""
    reader = await _metrics_reader(request)
    state.metrics.snapshot.data = take_snapshot(state.runtime)
    state.metrics.pending.set(len(state.pending))
    return Response(state.metrics.render(reader), media_type=CONTENT_TYPE)
