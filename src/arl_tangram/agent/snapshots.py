"""Shell: snapshot, rollback and snapshot-based sandboxes of the image envs on one node.

Who calls: the live executor, on worker threads (every call blocks: a copy, a sandbox
restart), for the core's ``snapshot`` and ``rollback`` actions and for envs whose spec names
a ``snapshot``. The core runs those actions alone on their env (``core.snapshots``), so the
env's writable layer is quiescent while it is copied.

What a snapshot covers: the env's whole writable layer (its root's upper, which holds
``/workspace`` and ``/tmp`` too on an image). What it does not: processes. Overlayfs cannot
add a lower to a live mount, so after a snapshot (and at a rollback) the env's sandbox is
restarted on the new layer stack with a fresh upper; a snapshot or rollback of an env with
an open session is refused (``SpecError`` naming ``snapshot``), so no shell is ever killed
behind its caller's back. Background processes cannot outlive their action, so none exist.

Pins: an env standing on a snapshot, or a snapshot whose stack holds its layer, keeps it
(deletion refused); each snapshot pins its image in the image store (``snapshot:<id>``), so
image garbage collection never takes a layer a snapshot stands on.
"""

from __future__ import annotations

import os
import secrets
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from arl_tangram.core.env_spec import check_snapshot_id
from arl_tangram.core.errors import SpecError
from arl_tangram.managers.cpu.rootfs import STAGE_DIR, ImageRoot
from arl_tangram.managers.cpu.snapshot_store import SnapshotRecord, SnapshotStore


class SnapshotNotFoundError(SpecError):
    """No such snapshot or env, or another tenant's (an HTTP 404)."""


class SnapshotInUseError(SpecError):
    """The snapshot is pinned by a live env or another snapshot (an HTTP 409)."""


@dataclass(frozen=True)
class EnvRoot:
    """What an image env stands on: its image (reference and store id), the image's layer
    directories (lowest first) and the snapshot it started from or last took ("" : none)."""

    image: str
    image_id: str
    image_lowers: tuple[Path, ...]
    base: str = ""


def new_snapshot_id() -> str:
    return f"snap-{secrets.token_hex(8)}"


class NodeSnapshots:
    """The snapshots of one node's image envs. ``roots`` is per live env; the lock orders
    decisions about pins and deletions (copies and restarts run outside it)."""

    def __init__(self, store: SnapshotStore, images: Any) -> None:
        self.store = store
        self.images = images
        self.roots: dict[str, EnvRoot] = {}
        self.lock = threading.Lock()
        for record in store.list():  # a restart keeps snapshots: their images stay pinned
            if images is not None and images.lookup(record.image_id) is not None:
                images.pin(record.image_id, f"snapshot:{record.snapshot_id}")

    # -- lookups ------------------------------------------------------------------------
    def get(self, snapshot_id: str, tenant: str | None = None) -> SnapshotRecord:
        """The snapshot, else ``SnapshotNotFoundError`` (another tenant's is not found either)."""
        record = self.store.get(check_snapshot_id(snapshot_id))
        if record is None or (tenant is not None and record.tenant != tenant):
            raise SnapshotNotFoundError("snapshot_id", "must name a snapshot of this tenant", snapshot_id)
        return record

    def lowers_of(self, root: EnvRoot, record: SnapshotRecord | None) -> tuple[Path, ...]:
        stack = record.stack if record is not None else ()
        return (*root.image_lowers, *(self.store.layer_dir(s) for s in stack))

    # -- env lifecycle ------------------------------------------------------------------
    def note_env(self, env_id: str, root: EnvRoot) -> None:
        with self.lock:
            self.roots[env_id] = root

    def forget_env(self, env_id: str) -> None:
        with self.lock:
            self.roots.pop(env_id, None)

    def child_root(self, record: SnapshotRecord, image_lowers: tuple[Path, ...], writable_bytes: int) -> ImageRoot:
        """The root of a new env on ``record``: its image's layers and the snapshot's stack
        as lowers (shared, never copied) under a fresh upper of ``writable_bytes``; the
        snapshot's environment, working directory and user."""
        lowers = self.lowers_of(EnvRoot(record.image, record.image_id, image_lowers), record)
        return ImageRoot(lower_dirs=lowers, env=record.env, working_dir=record.working_dir, uid=record.uid, gid=record.gid,
                         writable_bytes=writable_bytes)  # fmt: skip

    # -- actions ------------------------------------------------------------------------
    def take(self, cpu: Any, env_id: str, tenant: str, name: str, snapshot_id: str | None = None) -> SnapshotRecord:
        """Freeze the env's writable layer as a snapshot, then restart the env on it."""
        root, env_root = self._quiet_image_root(cpu, env_id, "snapshot")
        base = self.store.get(env_root.base) if env_root.base else None
        sid = snapshot_id or new_snapshot_id()
        record = SnapshotRecord(
            sid, tenant, name, env_id, env_root.image, env_root.image_id, (*(base.stack if base else ()), sid),
            base.lineage() if base else (), root.env, root.working_dir, root.uid, root.gid,
        )  # fmt: skip
        fd = cpu.get_sandbox(env_id).open_stage(STAGE_DIR)
        try:
            st = os.statvfs(f"/proc/self/fd/{fd}")
            record = replace(record, dirty_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize)
            record = self.store.commit(record, f"/proc/{os.getpid()}/fd/{fd}/upper")  # cp is another process
        finally:
            os.close(fd)
        if self.images is not None:
            self.images.pin(record.image_id, f"snapshot:{sid}")
        self._restack(cpu, env_id, root, replace(env_root, base=sid), record)
        return record

    def rollback(self, cpu: Any, env_id: str, tenant: str, snapshot_id: str) -> SnapshotRecord:
        """Restart the env on a snapshot it descends from, with a fresh upper."""
        record = self.get(snapshot_id, tenant)
        root, env_root = self._quiet_image_root(cpu, env_id, "rollback")
        base = self.store.get(env_root.base) if env_root.base else None
        if base is None or snapshot_id not in base.lineage():
            raise SpecError("snapshot_id", f"must be a snapshot env {env_id} descends from", snapshot_id)
        self._restack(cpu, env_id, root, replace(env_root, base=snapshot_id), record)
        return record

    def delete(self, snapshot_id: str, tenant: str | None) -> None:
        """Delete an unpinned snapshot; ``SnapshotInUseError`` naming who keeps a pinned one."""
        self.get(snapshot_id, tenant)
        with self.lock:
            keeper = self.store.pinned_by(snapshot_id, {e: r.base for e, r in self.roots.items() if r.base})
            if keeper is not None:
                raise SnapshotInUseError("snapshot_id", f"must not be in use (kept by {keeper})", snapshot_id)
            self.store.remove(snapshot_id)
        if self.images is not None:
            self.images.unpin(f"snapshot:{snapshot_id}")

    def _quiet_image_root(self, cpu: Any, env_id: str, what: str) -> tuple[ImageRoot, EnvRoot]:
        root = cpu.sandbox_info(env_id).spec.root
        with self.lock:
            env_root = self.roots.get(env_id)
        if root is None or env_root is None:
            raise SpecError(what, "needs an image env (the host root has no writable layer of its own)", env_id)
        if cpu.sessions.count(env_id):
            raise SpecError(what, "refused while the env has an open session (process state is not part of a "
                            "snapshot; the env restarts on the new layers): close its sessions first", env_id)  # fmt: skip
        return root, env_root

    def _restack(self, cpu: Any, env_id: str, root: ImageRoot, env_root: EnvRoot, record: SnapshotRecord) -> None:
        """Restart the env's sandbox under the same id on ``record``'s stack, fresh upper."""
        spec = cpu.sandbox_info(env_id).spec
        new_root = replace(root, lower_dirs=self.lowers_of(env_root, record))
        cpu.destroy_sandbox(env_id)
        with self.lock:
            self.roots[env_id] = env_root
        cpu.create_sandbox(replace(spec, root=new_root), sandbox_id=env_id)
