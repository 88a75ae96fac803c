"""Shell: ``/v1/envs``: environments (stateful sandboxes), their files and bash sessions.

Creating an env waits until its sandbox is ready, bounded by ``create_timeout_s`` (a
placement that cannot come in time is released and answered 503 with ``Retry-After``,
never a hang). File calls are host-side (no CPU grant, no action) and run on worker
threads. Every call on an env renews its lease when the runtime keeps leases.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from arl_tangram.api.auth import State, Tenant
from arl_tangram.api.client_gone import wait_unless_gone
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.schemas import (
    ERROR_RESPONSES,
    SANDBOX_PATH_PATTERN,
    EnvCreate,
    EnvList,
    EnvView,
    SessionCreate,
    SessionView,
)
from arl_tangram.api.state import ApiState, Conflict, NotFound, Overloaded, new_id
from arl_tangram.core.action import EnvSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import parse_size_bytes

router = APIRouter(prefix="/v1/envs", tags=["envs"], route_class=JsonBodyRoute)
PathQuery = Annotated[
    str, Query(min_length=1, max_length=4096, pattern=SANDBOX_PATH_PATTERN, description="a path in the sandbox: /workspace or /tmp on a host-root env, anywhere but /proc, /sys, /dev on an image env (components of at most 255 bytes)"),
]


def env_view(state: ApiState, tenant: str, internal: str) -> dict[str, Any]:
    s = state.controller.loop.state
    env = s.envs.get(internal)
    spec = env.spec if env else state.controller.env_specs.get(internal)
    return {
        "env_id": state.external(tenant, internal),
        "image": spec.image if spec else "host",
        "mem_bytes": spec.mem_bytes if spec else 0,
        "trajectory_id": env.spec.trajectory_id if env else "",
        "ready": bool(env and env.ready),
        "num_running": len(s.env_busy.get(internal, ())),
    }


@router.post("", response_model=EnvView, status_code=201, responses=ERROR_RESPONSES)
async def create_env(state: State, tenant: Tenant, body: EnvCreate, request: Request) -> Any:
    """Create a sandbox: its memory is held for its life, it uses no CPU while idle. On an
    image (a reference or ``sha256:`` id) its node pulls the layers it lacks first. A
    client that closes its connection before the answer is gone: the env is released."""
    mem_bytes = parse_size_bytes(body.memory, "memory")
    largest = state.max_env_mem_bytes()
    if mem_bytes > largest:
        raise Conflict("memory", f"must fit one node's memory ({largest} bytes)", body.memory)
    external = body.env_id or new_id("env")
    internal = state.scoped(tenant, external)
    if internal in state.controller.env_specs:
        raise Conflict("env_id", "must be unique among this tenant's live envs", external)
    image = body.image
    if body.snapshot is not None:  # its image is the snapshot's (another tenant's: 404)
        try:
            image = (await asyncio.to_thread(state.controller.snapshots.get, body.snapshot, tenant))["image"]
        except SpecError:
            raise NotFound("snapshot", body.snapshot) from None
    spec = EnvSpec(
        internal, mem_bytes, tenant, body.trajectory_id, image=image, pids_max=body.pids_max,
        workspace_bytes=parse_size_bytes(body.workspace, "workspace"), tmp_bytes=parse_size_bytes(body.tmp, "tmp"),
        writable_bytes=parse_size_bytes(body.writable, "writable"), snapshot=body.snapshot or "",
    )  # fmt: skip
    # A task of its own, so that the release below (not a cancelled await) ends the creation.
    task = state.spawn(state.controller.create_env(spec))
    if not await wait_unless_gone(request, task, state.create_timeout_s):
        state.controller.release_env(internal)  # made for no one: it would hold the pool for a lease
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    if not task.done():
        state.controller.release_env(internal)
        raise Overloaded(f"no node could place the env within create_timeout_s={state.create_timeout_s:g}", 5.0)
    task.result()  # EnvFailedError / SpecError name why
    return env_view(state, tenant, internal)


@router.get("", response_model=EnvList, responses=ERROR_RESPONSES)
async def list_envs(state: State, tenant: Tenant) -> dict[str, Any]:
    return {"envs": [env_view(state, tenant, e) for e in state.envs_of(tenant)]}


@router.get("/{env_id}", response_model=EnvView, responses=ERROR_RESPONSES)
async def get_env(state: State, tenant: Tenant, env_id: str) -> dict[str, Any]:
    return env_view(state, tenant, state.env_internal(tenant, env_id))


@router.delete("/{env_id}", status_code=204, responses=ERROR_RESPONSES)
async def delete_env(state: State, tenant: Tenant, env_id: str) -> Response:
    """Release the env: its queued actions end ``cancelled``, its sandbox is destroyed."""
    internal = state.env_internal(tenant, env_id)
    state.sessions.pop(internal, None)
    state.controller.release_env(internal)
    return Response(status_code=204)


@router.post("/{env_id}/renew", status_code=204, responses=ERROR_RESPONSES)
async def renew_env(state: State, tenant: Tenant, env_id: str) -> Response:
    """Renew the env's lease (any call on the env does too)."""
    state.env_internal(tenant, env_id)
    return Response(status_code=204)


def _cpu(state: ApiState, internal: str) -> Any:
    cpu = state.controller.env_node(internal).cpu
    if cpu is None:
        raise SpecError("env_id", "must name an env on a node with a CPU manager", internal)
    return cpu


@router.put(
    "/{env_id}/files", status_code=204, responses=ERROR_RESPONSES,
    openapi_extra={"requestBody": {"required": False, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
)  # fmt: skip
async def write_file(state: State, tenant: Tenant, env_id: str, path: PathQuery, request: Request) -> Response:
    """Create or atomically replace a file (the body's bytes; no body: an empty file) in the
    workspace or /tmp (parents created). A body past ``[service] max_file_body_bytes`` is 413."""
    internal = state.env_internal(tenant, env_id)
    data = await request.body()  # bounded by the edge
    await asyncio.to_thread(_cpu(state, internal).write_file, internal, path, data)
    return Response(status_code=204)


@router.get(
    "/{env_id}/files", responses={**ERROR_RESPONSES, 200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"}}
)
async def read_file(state: State, tenant: Tenant, env_id: str, path: PathQuery) -> Response:
    internal = state.env_internal(tenant, env_id)
    data = await asyncio.to_thread(_cpu(state, internal).read_file, internal, path)
    return Response(data, media_type="application/octet-stream")


@router.post("/{env_id}/sessions", response_model=SessionView, status_code=201, responses=ERROR_RESPONSES)
async def open_session(state: State, tenant: Tenant, env_id: str, body: SessionCreate) -> dict[str, Any]:
    """A persistent bash in the env; run commands in it with ``exec`` actions naming it."""
    internal = state.env_internal(tenant, env_id)
    cpu = _cpu(state, internal)
    session_id = await asyncio.to_thread(cpu.open_session, internal, env=body.env, cwd=body.cwd)
    if internal not in state.controller.env_specs:  # released meanwhile
        await asyncio.to_thread(cpu.close_session, session_id)
        raise NotFound("env_id", env_id)
    state.sessions.setdefault(internal, set()).add(session_id)
    return {"session_id": session_id}


@router.delete("/{env_id}/sessions/{session_id}", status_code=204, responses=ERROR_RESPONSES)
async def close_session(state: State, tenant: Tenant, env_id: str, session_id: str) -> Response:
    internal = state.env_internal(tenant, env_id)
    sessions = state.sessions.get(internal, set())
    if session_id not in sessions:
        raise NotFound("session_id", session_id)
    sessions.discard(session_id)
    await asyncio.to_thread(_cpu(state, internal).close_session, session_id)
    return Response(status_code=204)
