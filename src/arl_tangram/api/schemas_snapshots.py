"""Shell: the JSON bodies and views of snapshot, fork and rollback (``routes_snapshots``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from arl_tangram.api.schemas import EnvView, JsonInt, _Strict

SNAPSHOT_ID_PATTERN = r"^snap-[a-z0-9]{6,40}$"


class SnapshotCreate(_Strict):
    """Freeze the env's filesystem (never its processes) as a read-only snapshot."""

    name: str | None = Field(None, max_length=128)


class ForkCreate(_Strict):
    """``count`` children of the env as it is now (bounded by ``[images] max_fork_count``,
    past it 422 naming ``count``)."""

    count: JsonInt = Field(..., ge=1, le=4096, description="1..max_fork_count (the server's [images] setting, 64 by default)")


class RollbackBody(_Strict):
    snapshot_id: str = Field(..., pattern=SNAPSHOT_ID_PATTERN)


class SnapshotView(BaseModel):
    snapshot_id: str
    env_id: str
    name: str = ""
    image: str = ""
    dirty_bytes: int = 0
    depth: int = 1
    ancestors: list[str] = []
    squash_ms: float | None = None
    created_s: float = 0.0
    act: dict[str, float] = {}


class SnapshotList(BaseModel):
    snapshots: list[SnapshotView]


class ForkView(BaseModel):
    envs: list[EnvView]
    snapshot_id: str
