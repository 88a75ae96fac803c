"""Shell: snapshots over HTTP: ``POST /v1/envs/{id}/snapshots``, ``POST /v1/envs/{id}/fork``,
``POST /v1/envs/{id}/rollback``, ``GET /v1/snapshots[/{id}]``, ``DELETE /v1/snapshots/{id}``.

Each is the controller's snapshot call (``runtime.snapshots``: scheduled actions of the env).
Another tenant's snapshot or env is 404; a snapshot in use is 409 on delete, and so is a
snapshot, fork or rollback the env's state refuses (a host-root env, an open session, a
node without a store: 409 naming ``snapshot``); a rule (a rollback to a snapshot the env does
not descend from, a ``count`` past ``max_fork_count``) is 422 naming the field. Process state is not part of a
snapshot: the env restarts on the new layers, in the same working directory.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from arl_tangram.agent.snapshots import SnapshotInUseError, SnapshotNotFoundError
from arl_tangram.api.auth import State, Tenant
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.routes_envs import env_view
from arl_tangram.api.schemas import ERROR_RESPONSES
from arl_tangram.api.schemas_snapshots import (
    SNAPSHOT_ID_PATTERN,
    ForkCreate,
    ForkView,
    RollbackBody,
    SnapshotCreate,
    SnapshotList,
    SnapshotView,
)
from arl_tangram.api.state import ApiState, Conflict, NotFound
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.snapshots import public

router = APIRouter(tags=["snapshots"], route_class=JsonBodyRoute)
SnapshotId = Annotated[str, Path(pattern=SNAPSHOT_ID_PATTERN, description="a snapshot id: snap- and 6-40 lowercase letters or digits")]


def _view(state: ApiState, tenant: str, snap: dict[str, Any]) -> dict[str, Any]:
    out = dict(snap)
    env_id = str(out["env_id"])
    if env_id.startswith(state.scoped(tenant, "")):
        out["env_id"] = state.external(tenant, env_id)
    return out


async def _guard(call: Any) -> Any:
    """Run a snapshot call, mapping its errors to 404 / 409 (a plain SpecError stays 422)."""
    try:
        return await call
    except SnapshotNotFoundError as exc:
        raise NotFound(exc.field, str(exc.value)) from None
    except SnapshotInUseError as exc:
        raise Conflict(exc.field, exc.rule, exc.value) from None
    except SpecError as exc:  # the env's state (a host root, an open session, no store): 409
        if exc.field == "snapshot":
            raise Conflict(exc.field, exc.rule, exc.value) from None
        raise


@router.post("/v1/envs/{env_id}/snapshots", response_model=SnapshotView, status_code=201, responses=ERROR_RESPONSES)
async def snapshot_env(state: State, tenant: Tenant, env_id: str, body: SnapshotCreate) -> dict[str, Any]:
    """Freeze the env's writable layer as a snapshot; the env goes on on top of it."""
    internal = state.env_internal(tenant, env_id)
    return _view(state, tenant, await _guard(state.controller.snapshots.snapshot(internal, tenant, body.name)))


@router.post("/v1/envs/{env_id}/fork", response_model=ForkView, status_code=201, responses=ERROR_RESPONSES)
async def fork_env(state: State, tenant: Tenant, env_id: str, body: ForkCreate) -> dict[str, Any]:
    """``count`` new envs starting from the env's filesystem as it is now, on its node."""
    internal = state.env_internal(tenant, env_id)
    children = await _guard(state.controller.snapshots.fork(internal, tenant, body.count))
    return {"envs": [env_view(state, tenant, c.env_id) for c in children], "snapshot_id": children[0].snapshot}


@router.post("/v1/envs/{env_id}/rollback", response_model=SnapshotView, responses=ERROR_RESPONSES)
async def rollback_env(state: State, tenant: Tenant, env_id: str, body: RollbackBody) -> dict[str, Any]:
    """Restart the env on a snapshot it descends from, with a fresh writable layer."""
    internal = state.env_internal(tenant, env_id)
    return _view(state, tenant, await _guard(state.controller.snapshots.rollback(internal, tenant, body.snapshot_id)))


@router.get("/v1/snapshots", response_model=SnapshotList, responses=ERROR_RESPONSES)
async def list_snapshots(state: State, tenant: Tenant) -> dict[str, Any]:
    snaps = await asyncio.to_thread(state.controller.snapshots.catalog, tenant)
    return {"snapshots": [_view(state, tenant, s) for s in snaps]}


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


@router.get("/v1/snapshots/{snapshot_id}", response_model=SnapshotView, responses=ERROR_RESPONSES)
async def get_snapshot(state: State, tenant: Tenant, snapshot_id: SnapshotId) -> dict[str, Any]:
    snap = await _guard(_in_thread(state.controller.snapshots.get, snapshot_id, tenant))
    return _view(state, tenant, public(snap))


@router.delete("/v1/snapshots/{snapshot_id}", status_code=204, responses=ERROR_RESPONSES)
async def delete_snapshot(state: State, tenant: Tenant, snapshot_id: SnapshotId) -> Response:
    """Delete a snapshot; 409 while a live env or another snapshot stands on it."""
    await _guard(_in_thread(state.controller.snapshots.delete, snapshot_id, tenant))
    return Response(status_code=204)
