"""Shell: the store's on-disk index (``index.json``): which layers are unpacked (bytes, last
use) and which images exist (references, layers, config). Written atomically (temp file,
fsync, rename), so a crash leaves the old or the new index, never a torn one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from arl_tangram.managers.images.model import ImageConfig


@dataclass(frozen=True)
class IndexedImage:
    image_id: str
    references: tuple[str, ...]
    layers: tuple[str, ...]
    config: ImageConfig


@dataclass(frozen=True)
class IndexedLayer:
    unpacked_bytes: int
    last_used: float


def load_index(path: Path) -> tuple[dict[str, IndexedLayer], dict[str, IndexedImage]]:
    """The index at ``path`` (empty when absent or unreadable: recovery then drops the dirs)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        layers = {d: IndexedLayer(int(v["unpacked_bytes"]), float(v["last_used"])) for d, v in doc["layers"].items()}
        images = {}
        for image_id, v in doc["images"].items():
            cfg = v["config"]
            config = ImageConfig(tuple((str(k), str(x)) for k, x in cfg["env"]), cfg["working_dir"], cfg["user"],
                                 int(cfg["uid"]), int(cfg["gid"]))
            images[image_id] = IndexedImage(image_id, tuple(v["references"]), tuple(v["layers"]), config)
        return layers, images
    except (OSError, ValueError, KeyError, TypeError):
        return {}, {}


def save_index(path: Path, layers: dict[str, IndexedLayer], images: dict[str, IndexedImage]) -> None:
    """Replace the index at ``path`` atomically."""
    doc = {
        "version": 1,
        "layers": {d: asdict(v) for d, v in sorted(layers.items())},
        "images": {i: {"references": list(v.references), "layers": list(v.layers), "config": asdict(v.config)}
                   for i, v in sorted(images.items())},
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
