"""Shell: images in the live runtime: carrying out the core's pulls on a node's store,
resolving an env's image before it is requested, and what the faces ask of stores.

Who calls: the live executor (``run_pull``, a tracked task per ``PullImage``) and the
controller (``resolve_env_image``, ``layers_of_node``), on the event loop; every store call
runs on a worker thread. A store's ``ImageError`` carries ``.field``; it becomes a
``SpecError`` naming that field where a client is answered, and the cause of an
``ImagePullFailed`` (naming the layer and the registry's answer) where a pull ran.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from arl_tangram.agent.node import NodeAgent
from arl_tangram.agent.ports import ImagePort, ImageRecordLike
from arl_tangram.core.decisions import PullImage
from arl_tangram.core.env_spec import EnvSpec, LayerNeed
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import Event, ImagePulled, ImagePullFailed, NodeLayersChanged

Blocking = Callable[..., Awaitable[Any]]
# the store names a failed layer "layer sha256:..." (a blob) or "layer: sha256:..." in its message
_LAYER = re.compile(r"\blayer:? (sha256:[0-9a-f]{64})")


def layer_needs(record: ImageRecordLike) -> tuple[LayerNeed, ...]:
    """The core's view of an image's layers, lowest first."""
    return tuple(LayerNeed(layer.digest, int(layer.unpacked_bytes)) for layer in record.layers)


def pull_cause(exc: BaseException) -> tuple[str, str]:
    """(cause, layer digest or "") of a failed pull: the store's ``ImageError`` names its
    field and the registry's status, and the layer in its message (whichever field failed:
    a blob's 401 is the registry's, a digest mismatch the layer's); anything else is named
    by its type."""
    field = getattr(exc, "field", None)
    text = str(exc)
    cause = text if field and text.startswith(f"{field}:") else f"{field or type(exc).__name__}: {text}"
    found = _LAYER.search(text)
    return cause, found.group(1) if found else ""


def layers_of_node(agent: NodeAgent) -> NodeLayersChanged | None:
    """The event reporting every layer ``agent``'s store holds (None without a store)."""
    if agent.images is None or agent.cpu is None:
        return None
    held = agent.layer_bytes()
    return NodeLayersChanged(agent.cpu_node_id, tuple(LayerNeed(d, int(b)) for d, b in sorted(held.items())))


async def run_pull(blocking: Blocking, agent: NodeAgent, d: PullImage, post: Callable[[Event], object]) -> None:
    """Carry a ``PullImage`` out on ``agent``'s store; post ``ImagePulled`` (every layer of
    the image, the bytes this pull fetched and its time) or ``ImagePullFailed``. Never raises."""
    started = time.monotonic()
    try:
        images = agent.images
        if images is None:
            raise RuntimeError(f"node {d.node_id} has no image store")
        before = await blocking(images.layer_bytes)
        record = await blocking(images.pull, d.image)
    except Exception as exc:  # the pull's failure is its envs', reported, never raised
        cause, layer = pull_cause(exc)
        post(ImagePullFailed(d.pull_id, d.node_id, d.image, cause, layer, stimulus_id=d.stimulus_id))
        return
    layers = layer_needs(record)
    fetched = sum(layer.size_bytes for layer in layers if layer.digest not in before)
    elapsed = max(time.monotonic() - started, 1e-6)
    post(ImagePulled(d.pull_id, d.node_id, d.image, layers, elapsed, fetched, stimulus_id=d.stimulus_id))


def image_stores(agents: Sequence[NodeAgent]) -> list[ImagePort]:
    return [a.images for a in agents if a.images is not None and a.cpu is not None]


async def resolve_env_image(agents: Sequence[NodeAgent], spec: EnvSpec) -> EnvSpec:
    """``spec`` with its image's layers, when a node's store knows the image (its index
    only: no registry traffic); unchanged for the host root or an image no node holds yet.
    ``SpecError`` naming ``image`` when no node has a store, or a store refuses the name."""
    if not spec.on_image or spec.layers:
        return spec
    stores = image_stores(agents)
    if not stores:
        raise SpecError("image", "needs a node with an image store ([images] store_path); only 'host' and 'python' run here", spec.image)
    for store in stores:
        try:
            record = await asyncio.to_thread(store.lookup, spec.image)
        except Exception as exc:
            raise as_spec_error(exc, "image", spec.image) from exc
        if record is not None:
            return replace(spec, layers=layer_needs(record))
    return spec


def as_spec_error(exc: BaseException, default_field: str, value: object) -> BaseException:
    """A store's ``ImageError`` as a ``SpecError`` on its field (a 4xx for the client);
    anything else unchanged."""
    field = getattr(exc, "field", None)
    if field is None:
        return exc
    return SpecError(str(field) or default_field, str(exc), value)
