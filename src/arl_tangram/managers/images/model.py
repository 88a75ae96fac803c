"""Shell: the image store's records, as CORE and SANDBOX see them (frozen, no I/O).

Layers are identified by their diff_id (the sha256 of the uncompressed tar), unpacked once
per node into ``LayerRecord.path`` already in overlayfs form (whiteouts as 0:0 char devices,
opaque dirs as ``trusted.overlay.opaque=y``) with every uid/gid shifted by ``UID_SHIFT``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from arl_tangram.core.env_spec import UID_RANGE, UID_SHIFT
from arl_tangram.managers.images.config import ImageStoreConfig, RegistryCredentials
from arl_tangram.managers.images.errors import (
    ImageError,
    ImageNotFoundError,
    ImageRefError,
    LayerRefusedError,
    RegistryError,
)

#: image uid 0 is host uid UID_SHIFT; one shared unprivileged range of ID_RANGE ids for every
#: image sandbox (lowers are read-only, uppers private per mount namespace): the core's
#: constants, so the store's shift and the sandbox's user namespace mapping cannot drift apart.
ID_RANGE = UID_RANGE


@dataclass(frozen=True)
class ImageConfig:
    """What the sandbox honours of the image config. ``user`` as written in the image ("" =
    root); ``uid``/``gid`` resolved against the image's own /etc/passwd and /etc/group, as
    ids inside the namespace (unshifted)."""

    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = "/"
    user: str = ""
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class LayerRecord:
    """One unpacked layer: ``digest`` is its diff_id ("sha256:<hex>")."""

    digest: str
    unpacked_bytes: int
    path: Path


@dataclass(frozen=True)
class ImageRecord:
    """One image: ``image_id`` is its config digest; ``layers`` lowest first."""

    image_id: str
    references: tuple[str, ...]
    layers: tuple[LayerRecord, ...]
    config: ImageConfig
    size_bytes: int


@dataclass(frozen=True)
class PullProgress:
    """A progress report of one layer: ``phase`` is "fetch" (bytes are compressed bytes read),
    "unpack" (unpacked bytes written), "cached" (already on the node) or "done"."""

    reference: str
    layer_digest: str
    phase: str
    done_bytes: int
    total_bytes: int | None


def image_root_inputs(record: ImageRecord) -> tuple[tuple[Path, ...], tuple[tuple[str, str], ...], str, int, int]:
    """What a sandbox root needs of an image: (lower_dirs lowest first, env, working_dir, uid, gid)."""
    cfg = record.config
    return tuple(layer.path for layer in record.layers), cfg.env, cfg.working_dir, cfg.uid, cfg.gid


__all__ = [
    "ID_RANGE", "UID_SHIFT", "ImageConfig", "ImageError", "ImageNotFoundError", "ImageRecord", "ImageRefError",
    "ImageStoreConfig", "LayerRecord", "LayerRefusedError", "PullProgress", "RegistryCredentials", "RegistryError",
    "image_root_inputs",
]  # fmt: skip
