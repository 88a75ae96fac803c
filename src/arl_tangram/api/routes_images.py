"""Shell: ``/v1/images``: the images the nodes' stores hold, pulls ahead of need, removal.

``POST`` with a ``reference`` asks the scheduler to pull it onto the named nodes (all when
none are named): a pull is an action the core orders and bounds per node, so the answer is
202 at once and ``GET`` shows the image once it landed. ``POST`` with a ``path`` imports an
OCI layout, ``docker save`` tarball or root filesystem that lies on the server: only when
the operator set ``[images] allow_import_paths`` (403 otherwise). A store's refusal is a
4xx naming its field (``image``, ``registry``, ``layer``). Store calls run on worker threads.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Response
from pydantic import Field

from arl_tangram.agent.node import NodeAgent
from arl_tangram.agent.ports import ImageRecordLike
from arl_tangram.api.auth import State, Tenant
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.schemas import ERROR_RESPONSES, _Strict
from arl_tangram.api.state import ApiState, Conflict, NotFound
from arl_tangram.core.env_spec import check_image_reference
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.images import as_spec_error

router = APIRouter(prefix="/v1/images", tags=["images"], route_class=JsonBodyRoute)


class ImageCreate(_Strict):
    """Pull ``reference`` onto ``nodes`` (node ids; all when empty), or import ``path``."""

    reference: str | None = Field(None, min_length=1, max_length=512)
    nodes: list[str] = Field(default_factory=list, max_length=1024)
    path: str | None = Field(None, min_length=1, max_length=4096, description="a path on the server (operator only)")


def _stores(state: ApiState, required: bool = True) -> list[NodeAgent]:
    """The nodes with an image store. None (a server without ``[images]``) is the server's
    state, not the request's fault: a pull or import is refused 409, a list is empty."""
    agents = [a for a in state.controller.node_agents if a.images is not None and a.cpu is not None]
    if not agents and required:
        raise Conflict("image", "needs a node with an image store ([images] store_path)", None)
    return agents


def image_view(record: ImageRecordLike, nodes: list[str]) -> dict[str, Any]:
    return {
        "image_id": record.image_id, "references": list(record.references), "size_bytes": int(record.size_bytes),
        "layers": [{"digest": layer.digest, "size_bytes": int(layer.unpacked_bytes)} for layer in record.layers],
        "nodes": nodes,
    }  # fmt: skip


@router.get("", responses=ERROR_RESPONSES)
async def list_images(state: State, tenant: Tenant) -> dict[str, Any]:
    """Every image some node holds, with the nodes holding it."""
    by_id: dict[str, tuple[ImageRecordLike, list[str]]] = {}
    for agent in _stores(state, required=False):
        assert agent.images is not None
        for record in await asyncio.to_thread(agent.images.list_images):
            by_id.setdefault(record.image_id, (record, []))[1].append(agent.cpu_node_id)
    return {"images": [image_view(r, nodes) for _, (r, nodes) in sorted(by_id.items())]}


@router.post("", status_code=202, responses=ERROR_RESPONSES)
async def create_image(state: State, tenant: Tenant, body: ImageCreate) -> dict[str, Any]:
    agents = _stores(state)
    if body.reference is None and body.path is None:
        raise SpecError("reference", "must be given (or path, to import a file on the server)", None)
    if body.path is not None:
        return await _import(state, agents, body)
    reference = check_image_reference(body.reference, "reference")
    known = {a.cpu_node_id for a in agents}
    for node in body.nodes:
        if node not in known:
            raise Conflict("nodes", f"must name nodes with an image store ({', '.join(sorted(known))})", node)
    state.controller.prefetch(reference, tuple(body.nodes))
    return {"reference": reference, "nodes": body.nodes or sorted(known), "status": "pulling"}


async def _import(state: ApiState, agents: list[NodeAgent], body: ImageCreate) -> dict[str, Any]:
    images = state.runtime.config.images
    if images is None or not images.allow_import_paths:
        raise HTTPException(403, "path: importing a server path needs [images] allow_import_paths = true (operator only)")
    assert body.path is not None
    reference = None if body.reference is None else check_image_reference(body.reference, "reference")
    nodes = [a for a in agents if not body.nodes or a.cpu_node_id in body.nodes]
    record = None
    for agent in nodes:
        assert agent.images is not None
        try:
            record = await asyncio.to_thread(agent.images.import_path, Path(body.path), reference)
        except Exception as exc:
            raise as_spec_error(exc, "path", body.path) from exc
    if record is None:
        raise SpecError("nodes", "must name at least one node with an image store", body.nodes)
    return image_view(record, [a.cpu_node_id for a in nodes])


@router.delete("/{reference:path}", status_code=204, responses=ERROR_RESPONSES)
async def delete_image(state: State, tenant: Tenant, reference: str) -> Response:
    """Forget ``reference`` (or an image id) on every node; its layers go when unused."""
    removed = False
    for agent in _stores(state, required=False):
        assert agent.images is not None
        if await asyncio.to_thread(agent.images.lookup, reference) is None:
            continue
        try:
            await asyncio.to_thread(agent.images.remove, reference)
        except Exception as exc:
            raise as_spec_error(exc, "image", reference) from exc
        removed = True
    if not removed:
        raise NotFound("image", reference)
    return Response(status_code=204)
