"""Shell: a node's snapshot store: each snapshot of an image env is a read-only layer
directory (the env's frozen writable layer, in overlayfs' own upper format: whiteouts are
0/0 character devices, opaque directories carry ``trusted.overlay.opaque``) plus a
``meta.json`` saying what it stands on.

Crash safety: a snapshot is written under ``.tmp-<id>`` and renamed to ``<id>`` once its layer
and meta are complete; a deletion renames ``<id>`` to ``.del-<id>`` before removing it. So a
``kill -9`` at any point leaves either the old state or the new one, and ``recover`` (run
when the store opens) removes every half-written or half-deleted directory.

Depth: a snapshot's ``stack`` names the snapshot layers it stands on (lowest first, itself
last), above its image's layers. Past ``max_depth`` a new snapshot is *squashed*: its layer is
the merge of its whole stack, built with hard links (the layers are immutable), so the squash
costs one link per file, never a copy of the bytes, and the stack is one layer again.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from arl_tangram.core.env_spec import check_snapshot_id
from arl_tangram.core.errors import SpecError

OPAQUE_XATTR = "trusted.overlay.opaque"
META = "meta.json"


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot. ``stack``: snapshot ids whose layers it stands on, lowest first, itself
    last (physical). ``ancestors``: the snapshots it descends from, oldest first (logical:
    kept through squashes, it decides which rollbacks are allowed). ``image_id``: the image
    store's id of the image below. ``dirty_bytes``: the writable layer it froze."""

    snapshot_id: str
    tenant: str
    name: str
    env_id: str
    image: str
    image_id: str
    stack: tuple[str, ...]
    ancestors: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = "/"
    uid: int = 0
    gid: int = 0
    dirty_bytes: int = 0
    squash_ms: float | None = None
    created_s: float = field(default_factory=time.time)

    def lineage(self) -> tuple[str, ...]:
        """What an env standing on this snapshot descends from: its ancestors and itself."""
        return (*self.ancestors, self.snapshot_id)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> SnapshotRecord:
        fields = dict(data)
        for key in ("stack", "ancestors"):
            fields[key] = tuple(fields[key])  # type: ignore[arg-type]
        fields["env"] = tuple(tuple(pair) for pair in fields["env"])  # type: ignore[attr-defined]
        return cls(**fields)  # type: ignore[arg-type]


class SnapshotStore:
    """The snapshots of one node under ``root``. Thread-safe for distinct ids (each write
    goes to its own temp directory); the caller (the node agent) serialises what decides
    pins and deletions."""

    def __init__(self, root: Path, *, max_depth: int = 16) -> None:
        if not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1:
            raise SpecError("max_snapshot_depth", "must be an integer >= 1", max_depth)
        self.root = root
        self.max_depth = max_depth
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)  # layers hold the sandbox's files (shifted owners, setuid bits)
        self.recovered = self.recover()

    def recover(self) -> list[str]:
        """Remove what a killed process left half-written (``.tmp-*``) or half-deleted
        (``.del-*``); returns the names removed."""
        gone = []
        for entry in sorted(os.listdir(self.root)):
            if entry.startswith((".tmp-", ".del-")):
                shutil.rmtree(self.root / entry, ignore_errors=True)
                gone.append(entry)
        return gone

    def layer_dir(self, snapshot_id: str) -> Path:
        return self.root / snapshot_id / "layer"

    def get(self, snapshot_id: str) -> SnapshotRecord | None:
        try:
            check_snapshot_id(snapshot_id)
            data = json.loads((self.root / snapshot_id / META).read_text())
        except (SpecError, OSError, ValueError):
            return None
        return SnapshotRecord.from_json(data)

    def list(self) -> list[SnapshotRecord]:
        found = (self.get(e) for e in sorted(os.listdir(self.root)) if not e.startswith("."))
        return sorted((r for r in found if r is not None), key=lambda r: (r.created_s, r.snapshot_id))

    def commit(self, record: SnapshotRecord, upper: str | None) -> SnapshotRecord:
        """Write ``record``'s layer (a copy of the writable layer at ``upper``, merged with
        its stack below when the stack is past ``max_depth``) and meta, then publish it by
        rename. Returns the record as stored (its stack squashed, or not)."""
        tmp = self.root / f".tmp-{record.snapshot_id}"
        tmp.mkdir(mode=0o700)
        try:
            fresh = tmp / "upper" if len(record.stack) > self.max_depth else tmp / "layer"
            if upper is not None:
                _copy_tree(upper, fresh)
            else:
                fresh.mkdir()
            if fresh.name == "upper":
                t0 = time.perf_counter()
                layer = tmp / "layer"
                layer.mkdir()
                shutil.copystat(fresh, layer)
                os.chown(layer, os.stat(fresh).st_uid, os.stat(fresh).st_gid)
                for below in record.stack[:-1]:
                    merge_layer(self.layer_dir(below), layer)
                merge_layer(fresh, layer)
                shutil.rmtree(fresh)
                squash_ms = (time.perf_counter() - t0) * 1000
                record = replace(record, stack=(record.snapshot_id,), squash_ms=squash_ms)
            (tmp / META).write_text(json.dumps(record.to_json()))
            os.rename(tmp, self.root / record.snapshot_id)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return record

    def pinned_by(self, snapshot_id: str, live_bases: Mapping[str, str]) -> str | None:
        """Who keeps ``snapshot_id``: a live env standing on it (``live_bases``: env id ->
        the snapshot it stands on) or another snapshot whose stack holds its layer; None
        when nothing does."""
        for env_id, base in sorted(live_bases.items()):
            record = self.get(base)
            if record is not None and snapshot_id in record.stack:
                return f"env {env_id}"
        for record in self.list():
            if record.snapshot_id != snapshot_id and snapshot_id in record.stack:
                return f"snapshot {record.snapshot_id}"
        return None

    def remove(self, snapshot_id: str) -> None:
        """Delete a snapshot (the caller checked it is not pinned). Idempotent."""
        path = self.root / check_snapshot_id(snapshot_id)
        doomed = self.root / f".del-{snapshot_id}"
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)


def _copy_tree(src: str, dst: Path) -> None:
    """``cp -a``: owners, modes, times, xattrs (``trusted.overlay.*`` included: only root,
    never the sandbox, can set them), hard links and whiteout devices kept."""
    done = subprocess.run(["cp", "-a", "--no-target-directory", src, str(dst)], capture_output=True)
    if done.returncode != 0:
        raise OSError(f"snapshot copy failed: {done.stderr.decode(errors='replace').strip()[:500]}")


def _is_opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _remove(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def merge_layer(src: Path, dst: Path) -> None:
    """Apply overlay layer ``src`` on top of the merged layer ``dst`` as overlayfs would
    read them stacked: a non-directory (file, link, whiteout device) replaces what ``dst``
    has at its path (hard linked, never copied: layers are immutable); an opaque directory
    replaces the whole directory; another directory merges. Whiteouts stay whiteouts, so
    they still hide what the image below holds."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target_dir = dst if rel == "." else dst / rel
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            s, t = os.path.join(dirpath, name), os.path.join(target_dir, name)
            if os.path.lexists(t):
                _remove(t)
            os.link(s, t, follow_symlinks=False)
        for name in [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]:
            s, t = os.path.join(dirpath, name), os.path.join(target_dir, name)
            opaque = _is_opaque(s)
            if os.path.lexists(t) and (opaque or not os.path.isdir(t) or os.path.islink(t)):
                _remove(t)
            if not os.path.lexists(t):
                os.mkdir(t)
            st = os.lstat(s)
            os.chown(t, st.st_uid, st.st_gid)
            os.chmod(t, stat.S_IMODE(st.st_mode))
            if opaque:
                os.setxattr(t, OPAQUE_XATTR, b"y")
