"""Shell: an env's sandbox on one node: the core's ``EnvSpec`` turned into the CPU manager's
sandbox spec, on the host root or on an image from the node's store.

Who calls: the live executor, on a worker thread (every call here blocks: a store lookup
or pull, a sandbox start). An image env pins its image under the env id for the sandbox's
life, so the store's garbage collection never removes a layer a sandbox stands on;
``destroy_env_sandbox`` unpins it. The CPU manager never sees the store: this module hands
it the image's layer directories as an ``ImageRoot``.
"""

from __future__ import annotations

from typing import Any

from arl_tangram.agent.node import NodeAgent
from arl_tangram.agent.ports import ImagePort, ImageRecordLike
from arl_tangram.agent.snapshots import EnvRoot
from arl_tangram.core.env_spec import EnvSpec
from arl_tangram.core.errors import SpecError


def sandbox_fields(spec: EnvSpec) -> dict[str, Any]:
    """The CPU manager's ``SandboxSpec`` fields for ``spec`` (its root aside)."""
    return {"mem_bytes": spec.mem_bytes, "pids_max": spec.pids_max, "workspace_bytes": spec.workspace_bytes, "tmp_bytes": spec.tmp_bytes}


def image_root(record: ImageRecordLike, writable_bytes: int) -> Any:
    """The overlay root of a sandbox on ``record``: its layer directories lowest first, its
    config's environment, working directory and user, and the writable layer's cap."""
    from arl_tangram.managers.cpu.rootfs import ImageRoot

    config = record.config
    return ImageRoot(
        lower_dirs=tuple(layer.path for layer in record.layers), env=tuple(config.env), working_dir=config.working_dir or "/",
        uid=config.uid, gid=config.gid, writable_bytes=writable_bytes,
    )  # fmt: skip


def resolve_image(images: ImagePort, image: str) -> ImageRecordLike:
    """The node's record of ``image``: from the store's index, else pulled now (the core
    normally ordered the pull first; a layer collected since, or a reference whose layers
    came with another image, is fetched here). Raises the store's ``ImageError``."""
    record = images.lookup(image)
    return record if record is not None else images.pull(image)


def create_env_sandbox(agent: NodeAgent, spec: EnvSpec, env_id: str) -> None:
    """Start the sandbox of ``spec`` under ``env_id`` on ``agent``'s node. Raises (the caller
    reports ``EnvFailed``); on failure an image pinned for it is unpinned again."""
    from arl_tangram.managers.cpu.config import SandboxSpec

    cpu = agent.cpu
    if cpu is None:
        raise RuntimeError(f"node {agent.node_id} has no CPU manager")
    if not spec.on_image:
        cpu.create_sandbox(SandboxSpec(**sandbox_fields(spec)), sandbox_id=env_id)
        return
    images = agent.images
    if images is None:
        raise SpecError("image", f"node {agent.node_id} has no image store: only 'host' runs here", spec.image)
    snaps = agent.snapshots
    if spec.snapshot and snaps is None:
        raise SpecError("snapshot", f"node {agent.node_id} keeps no snapshots", spec.snapshot)
    snap = snaps.get(spec.snapshot, spec.tenant) if snaps is not None and spec.snapshot else None
    record = resolve_image(images, snap.image_id if snap is not None else spec.image)
    images.pin(record.image_id, env_id)
    try:
        root = image_root(record, spec.writable_bytes)
        if snaps is not None and snap is not None:  # the snapshot's layers over the image's, a fresh upper: no copy
            root = snaps.child_root(snap, root.lower_dirs, spec.writable_bytes)
        cpu.create_sandbox(SandboxSpec(**sandbox_fields(spec), root=root), sandbox_id=env_id)
    except BaseException:
        images.unpin(env_id)
        raise
    if snaps is not None:
        lowers = tuple(layer.path for layer in record.layers)
        snaps.note_env(env_id, EnvRoot(spec.image, record.image_id, lowers, spec.snapshot))


def destroy_env_sandbox(agent: NodeAgent, env_id: str) -> None:
    """Destroy the env's sandbox if it exists, then let its image's layers be collected.
    Idempotent: an env never created, or already gone, is left alone."""
    cpu = agent.cpu
    try:
        if cpu is not None and env_id in cpu.list_sandboxes():
            cpu.destroy_sandbox(env_id)
    finally:
        if agent.snapshots is not None:
            agent.snapshots.forget_env(env_id)
        if agent.images is not None:
            agent.images.unpin(env_id)
