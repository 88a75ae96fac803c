"""Shell: the node's image store (content-addressed layers, hostile-safe unpacking, registry
client, local sources, garbage collection).

Entry point: ``ImageStore`` (``store.py``); records in ``model.py``.
"""

from arl_tangram.managers.images.model import (
    ID_RANGE,
    UID_SHIFT,
    ImageConfig,
    ImageError,
    ImageNotFoundError,
    ImageRecord,
    ImageRefError,
    ImageStoreConfig,
    LayerRecord,
    LayerRefusedError,
    PullProgress,
    RegistryCredentials,
    RegistryError,
    image_root_inputs,
)
from arl_tangram.managers.images.store import ImageStore

__all__ = [
    "ID_RANGE", "UID_SHIFT", "ImageConfig", "ImageError", "ImageNotFoundError", "ImageRecord", "ImageRefError",
    "ImageStore", "ImageStoreConfig", "LayerRecord", "LayerRefusedError", "PullProgress", "RegistryCredentials",
    "RegistryError", "image_root_inputs",
]  # fmt: skip
