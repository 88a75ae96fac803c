"""Shell: the SDK's view of a snapshot (what ``Env.snapshot`` returns and
``create_env(snapshot=)`` / ``Env.rollback`` take)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """A read-only freeze of an env's filesystem (its writable layer: the root's changes,
    ``/workspace`` and ``/tmp``), never its processes. ``depth``: snapshot layers it stands
    on (bounded: deeper chains are squashed); ``ancestors``: snapshots it descends from;
    ``act``: the snapshot action's queue / exec / overhead seconds."""

    snapshot_id: str
    env_id: str
    name: str = ""
    dirty_bytes: int = 0
    depth: int = 1
    ancestors: tuple[str, ...] = ()
    squash_ms: float | None = None
    act: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        return cls(
            str(data["snapshot_id"]), str(data["env_id"]), str(data.get("name", "")), int(data.get("dirty_bytes", 0)),
            int(data.get("depth", 1)), tuple(data.get("ancestors", ())), data.get("squash_ms"), dict(data.get("act", {})),
        )  # fmt: skip


def snapshot_id_of(snapshot: Snapshot | str) -> str:
    return snapshot.snapshot_id if isinstance(snapshot, Snapshot) else snapshot
