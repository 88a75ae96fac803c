"""Snapshot tests below the controller: a real CPU manager, an image layer from host files
(``tests.managers.cpu.image_tree``) and a node's ``NodeSnapshots`` on a temp store. The
agent's own calls (``take``, ``rollback``, ``child_root``) do the work, as the executor's
actions would."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from arl_tangram.agent.snapshots import EnvRoot, NodeSnapshots
from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.rootfs import ImageRoot
from arl_tangram.managers.cpu.snapshot_store import SnapshotRecord, SnapshotStore

IMAGE_ID = "sha256:" + "0" * 64
SPEC = dict(mem_bytes=256 << 20, pids_max=128, workspace_bytes=16 << 20, tmp_bytes=16 << 20)


@dataclass
class Node:
    manager: CpuManager
    image: Path
    snaps: NodeSnapshots
    envs: list[str] = field(default_factory=list)

    def create(self, snapshot: SnapshotRecord | None = None) -> str:
        """A sandbox on the image, or a child on ``snapshot`` (fresh upper, no copy)."""
        env_id = f"e{secrets.token_hex(4)}"
        root = ImageRoot(lower_dirs=(self.image,), working_dir="/testbed", writable_bytes=64 << 20)
        if snapshot is not None:
            root = self.snaps.child_root(snapshot, (self.image,), 64 << 20)
        self.manager.create_sandbox(SandboxSpec(**SPEC, root=root), sandbox_id=env_id)  # type: ignore[arg-type]
        self.snaps.note_env(env_id, EnvRoot("img", IMAGE_ID, (self.image,), snapshot.snapshot_id if snapshot else ""))
        self.envs.append(env_id)
        return env_id

    def snapshot(self, env_id: str, name: str = "") -> SnapshotRecord:
        return self.snaps.take(self.manager, env_id, "t", name)

    def sh(self, env_id: str, command: str) -> str:
        r = self.manager.exec(env_id, command)
        assert r.ok, (command, r.stderr)
        return r.stdout.decode()

    def close(self) -> None:
        for env_id in self.envs:
            if env_id in self.manager.list_sandboxes():
                self.manager.destroy_sandbox(env_id)
            self.snaps.forget_env(env_id)
        self.envs.clear()


def open_node(manager: CpuManager, image: Path, store_dir: Path, max_depth: int = 16) -> Node:
    return Node(manager, image, NodeSnapshots(SnapshotStore(store_dir, max_depth=max_depth), None))
