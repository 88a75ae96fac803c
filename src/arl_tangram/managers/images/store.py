"""Shell: the node's image store (content-addressed layers shared by every image that has
them), fed by registry pulls and local imports.

Calling contract: every method is thread-safe and blocking (async callers run them in worker
threads). Concurrent pulls of one reference share one resolve and fetch; concurrent pulls of
different images share each common layer's single fetch+unpack (``layers.LayerSet``). A
pull's layers are held from their unpack until the image is committed, and images' layers
and pinned images' layers are never garbage-collected. Opening a store removes whatever a
killed process left half-done.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from arl_tangram.managers.images.config import ImageStoreConfig
from arl_tangram.managers.images.errors import ImageError, ImageNotFoundError
from arl_tangram.managers.images.index import IndexedImage, load_index, save_index
from arl_tangram.managers.images.install import Installer
from arl_tangram.managers.images.layers import LayerSet
from arl_tangram.managers.images.model import ImageRecord, PullProgress
from arl_tangram.managers.images.reference import is_image_id, parse_reference
from arl_tangram.managers.images.registry import RegistryClient
from arl_tangram.managers.images.sources import open_source

Progress = Callable[[PullProgress], None]


class ImageStore:
    """One node's image store under ``config.store_path`` (made 0700, owned by root)."""

    def __init__(self, config: ImageStoreConfig) -> None:
        self.config = config
        root = config.store_path
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # setuid files in layers must be unreachable by host users
        self._index_path = root / "index.json"
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pins: dict[str, tuple[str, tuple[str, ...]]] = {}  # holder -> (image id, layers)
        self._pulls: dict[str, Future[ImageRecord]] = {}
        self._clients: dict[str, RegistryClient] = {}
        layers, self._images = load_index(self._index_path)
        self.layers = LayerSet(root, config.max_layer_bytes, config.max_store_bytes, config.max_concurrent_pulls,
                               self._protected, self._save)
        self.layers.recover(layers)
        self._images = {i: v for i, v in self._images.items() if all(d in self.layers.layers for d in v.layers)}
        self._installer = Installer(self.layers, self._commit_image, self._canonical_or_none)
        self._save()

    def close(self) -> None:
        """Close registry connections (the store's files stay)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # -- feeding the store ---------------------------------------------------------------
    def pull(self, reference: str, progress: Progress | None = None) -> ImageRecord:
        """Pull ``reference`` from its registry; concurrent pulls of it share one pull (and its
        outcome; progress goes to the first caller's callback). An image id is answered from
        the store (it names no registry)."""
        if is_image_id(reference):
            found = self.lookup(reference)
            if found is None:
                raise ImageNotFoundError("image", "an image id names no registry, and it is not in the store", reference)
            return found
        ref = parse_reference(reference, self.config.default_registry, need_registry=True)
        key = ref.canonical()
        with self._lock:
            flight = self._pulls.get(key)
            leader = flight is None
            if flight is None:
                flight = self._pulls[key] = Future()
        if not leader:
            return flight.result()
        try:
            assert ref.registry is not None
            record = self._installer.pull(self._client(ref.registry), ref, progress)
        except BaseException as exc:
            with self._lock:
                self._pulls.pop(key, None)
            flight.set_exception(exc)
            raise
        with self._lock:
            self._pulls.pop(key, None)
        flight.set_result(record)
        return record

    def import_path(self, path: Path, reference: str | None = None, progress: Progress | None = None) -> ImageRecord:
        """Import an OCI layout dir, a docker-save tar, or a rootfs dir/tar (``progress`` as
        for ``pull``: each layer's unpack, then "done")."""
        canonical = parse_reference(reference, self.config.default_registry).canonical() if reference else None
        with open_source(Path(path), reference) as source:
            return self._installer.install(source, canonical, str(path), progress)

    # -- reading ---------------------------------------------------------------------------
    def lookup(self, reference_or_id: str) -> ImageRecord | None:
        """The image with this id or reference, or None (reads only the in-memory index)."""
        with self._lock:
            image = self._find(reference_or_id)
            if image is None:
                return None
            with self.layers.lock:
                self.layers.touch(image.layers)
                return self._record(image)

    def list_images(self) -> list[ImageRecord]:
        with self._lock, self.layers.lock:
            return [self._record(v) for _, v in sorted(self._images.items())]

    def layer_bytes(self) -> dict[str, int]:
        """digest -> unpacked bytes of every layer on this node (what the core sees)."""
        with self.layers.lock:
            return {d: v.unpacked_bytes for d, v in sorted(self.layers.layers.items())}

    # -- removing --------------------------------------------------------------------------
    def remove(self, reference_or_id: str) -> None:
        """Remove a reference (or, given an id, the image and all its references). Layers stay
        until ``gc`` needs their room."""
        with self._lock:
            image = self._find(reference_or_id)
            if image is None:
                raise ImageNotFoundError("image", "no such image in the store", reference_or_id)
            refs = tuple(r for r in image.references if r != self._canonical_or_none(reference_or_id))
            if is_image_id(reference_or_id) or not refs:
                del self._images[image.image_id]
            else:
                self._images[image.image_id] = IndexedImage(image.image_id, refs, image.layers, image.config)
        self._save()

    def pin(self, image_id: str, holder_id: str) -> None:
        """Keep ``image_id``'s layers from GC until ``unpin(holder_id)`` (sandboxes pin by env id)."""
        with self._lock:
            image = self._images.get(image_id)
            if image is None:
                raise ImageNotFoundError("image", "no such image to pin", image_id)
            self._pins[holder_id] = (image_id, image.layers)
            with self.layers.lock:
                self.layers.touch(image.layers)

    def unpin(self, holder_id: str) -> None:
        """Idempotent: unpinning an unknown holder does nothing."""
        with self._lock:
            self._pins.pop(holder_id, None)

    def gc(self, target_bytes: int | None = None) -> list[str]:
        """Remove unpinned, unreferenced layers no pull holds, LRU-first, while the store holds
        more than ``target_bytes`` (default ``max_store_bytes``; 0 = every unused layer)."""
        target = self.config.max_store_bytes if target_bytes is None else target_bytes
        return self.layers.evict(target_bytes=target)

    # -- internals -------------------------------------------------------------------------
    def _client(self, host: str) -> RegistryClient:
        with self._lock:
            client = self._clients.get(host)
            if client is None:
                client = self._clients[host] = RegistryClient(self.config.registry(host), self.config.request_timeout_s)
            return client

    def _canonical_or_none(self, text: str) -> str | None:
        try:
            return parse_reference(text, self.config.default_registry).canonical()
        except ImageError:
            return None

    def _find(self, reference_or_id: str) -> IndexedImage | None:
        """Caller holds ``_lock``. Bad references raise ``ImageRefError``."""
        if is_image_id(reference_or_id):
            return self._images.get(reference_or_id)
        key = parse_reference(reference_or_id, self.config.default_registry).canonical()
        return next((v for _, v in sorted(self._images.items()) if key in v.references), None)

    def _record(self, image: IndexedImage) -> ImageRecord:
        layers = tuple(self.layers.record(d) for d in image.layers)
        return ImageRecord(image.image_id, image.references, layers, image.config,
                           sum(x.unpacked_bytes for x in layers))

    def _commit_image(self, image: IndexedImage) -> ImageRecord:
        """Publish an image (its layers are present and held); a reference moves to it."""
        with self._lock:
            for other_id, other in list(self._images.items()):
                if other_id != image.image_id and set(other.references) & set(image.references):
                    refs = tuple(r for r in other.references if r not in image.references)
                    self._images[other_id] = IndexedImage(other_id, refs, other.layers, other.config)
            old = self._images.get(image.image_id)
            refs = tuple(dict.fromkeys((old.references if old else ()) + image.references))
            merged = IndexedImage(image.image_id, refs, image.layers, image.config)
            self._images[image.image_id] = merged
            with self.layers.lock:
                self.layers.touch(image.layers, time.time())
                record = self._record(merged)
        self._save()
        return record

    def _protected(self) -> set[str]:
        with self._lock:
            used = {d for v in self._images.values() for d in v.layers}
            return used | {d for _, layers in self._pins.values() for d in layers}

    def _save(self) -> None:
        """Write the index; one writer at a time, each writing a snapshot taken under it."""
        with self._write_lock:
            with self._lock, self.layers.lock:
                layers, images = dict(self.layers.layers), dict(self._images)
            save_index(self._index_path, layers, images)
