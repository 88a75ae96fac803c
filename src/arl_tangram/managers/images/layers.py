"""Shell: the node's unpacked layers: single-flight fetch+unpack per diff_id, holds that
keep a layer from GC while a pull uses it, byte reservations against the store quota, and
atomic commit (temp dir -> ``layers/<hex>``).

Locking: one lock guards the maps; no I/O runs under it (reserve under the lock, unpack
outside, publish under it). Callers pass ``protected()`` (layers images reference or
holders pin) so eviction never touches them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from arl_tangram.managers.images.errors import LayerRefusedError
from arl_tangram.managers.images.gc import select_victims
from arl_tangram.managers.images.index import IndexedLayer
from arl_tangram.managers.images.model import LayerRecord
from arl_tangram.managers.images.streams import BlobResult

#: temp dirs of an unpack in progress start with this: whatever carries it on open is
#: half-done work of a killed process and is removed
TEMP_MARK = "arl-partial-"

Unpacker = Callable[[Path, Callable[[int], None]], BlobResult]  # (dest dir, charge) -> result


class LayerSet:
    """Unpacked layers of one store; thread-safe."""

    def __init__(self, root: Path, max_layer_bytes: int, max_store_bytes: int, max_concurrent: int,
                 protected: Callable[[], set[str]], on_change: Callable[[], None]) -> None:
        self.dir = root / "layers"
        self.tmp = root / "tmp"
        self._max_layer, self._max_store = max_layer_bytes, max_store_bytes
        self._protected, self._on_change = protected, on_change
        self.lock = threading.Lock()
        self.layers: dict[str, IndexedLayer] = {}
        self._holds: Counter[str] = Counter()
        self._flights: dict[str, Future[LayerRecord]] = {}
        self._reserved = 0
        self._used = 0  # sum of the present layers' bytes, kept so the per-chunk check is O(1)
        self._slots = threading.BoundedSemaphore(max_concurrent)

    def path(self, digest: str) -> Path:
        return self.dir / digest.split(":", 1)[1]

    def record(self, digest: str) -> LayerRecord:
        """The record of a present layer (caller holds the lock or knows it is present)."""
        return LayerRecord(digest, self.layers[digest].unpacked_bytes, self.path(digest))

    def used_bytes(self) -> int:
        with self.lock:
            return self._used

    def touch(self, digests: tuple[str, ...], now: float | None = None) -> None:
        """Mark layers used (the LRU clock of GC); the caller holds the lock."""
        stamp = time.time() if now is None else now
        for d in digests:
            if d in self.layers:
                self.layers[d] = IndexedLayer(self.layers[d].unpacked_bytes, stamp)

    def release(self, digests: list[str]) -> None:
        with self.lock:
            for d in digests:
                self._holds[d] -= 1
                if self._holds[d] <= 0:
                    del self._holds[d]

    def ensure(self, diff_id: str, label: str, unpack: Unpacker, on_cached: Callable[[], None] | None = None) -> LayerRecord:
        """The layer ``diff_id``, unpacked once however many callers ask at the same time.

        The caller then holds it (``release`` it when the image is committed or failed)."""
        with self.lock:
            self._holds[diff_id] += 1
            if diff_id in self.layers:
                self.touch((diff_id,))
                if on_cached:
                    on_cached()
                return self.record(diff_id)
            flight = self._flights.get(diff_id)
            leader = flight is None
            if flight is None:
                flight = self._flights[diff_id] = Future()
        if not leader:
            return flight.result()
        try:
            record = self._unpack_and_commit(label, unpack, expected=diff_id)
        except BaseException as exc:
            with self.lock:
                self._flights.pop(diff_id, None)
            flight.set_exception(exc)
            raise
        with self.lock:
            self._flights.pop(diff_id, None)
        flight.set_result(record)
        return record

    def unpack_unknown(self, label: str, unpack: Unpacker) -> LayerRecord:
        """A layer whose diff_id is known only after unpacking (a rootfs); held like ``ensure``."""
        return self._unpack_and_commit(label, unpack, expected=None)

    def _unpack_and_commit(self, label: str, unpack: Unpacker, expected: str | None) -> LayerRecord:
        charged = [0]

        def charge(n: int) -> None:
            charged[0] += n
            if charged[0] > self._max_layer:
                raise LayerRefusedError("layer", f"{label}: unpacks past the per-layer cap of {self._max_layer} bytes")
            self._reserve(n, label)

        with self._slots:
            tmp = Path(tempfile.mkdtemp(prefix=TEMP_MARK, dir=self.tmp))
            try:
                result = unpack(tmp, charge)
                if expected is not None and result.diff_id != expected:
                    raise LayerRefusedError("layer", f"{label}: diff_id is {result.diff_id}, expected {expected}")
                return self._commit(tmp, result, held=expected is not None, charged=charged)
            finally:
                with self.lock:
                    self._reserved -= charged[0]
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)

    def _reserve(self, n: int, label: str) -> None:
        """Reserve ``n`` more bytes; evict unprotected layers if that is what it takes."""
        with self.lock:
            self._reserved += n
            over = self._used_locked() + self._reserved - self._max_store
            if over <= 0:
                return
        self.evict(target_bytes=self._max_store)
        with self.lock:
            if self._used_locked() + self._reserved > self._max_store:
                raise LayerRefusedError(
                    "layer", f"{label}: does not fit the store quota max_store_bytes={self._max_store} "
                             f"({self._used_locked()} bytes held by images in use)")

    def _used_locked(self) -> int:
        return self._used

    def _commit(self, tmp: Path, result: BlobResult, held: bool, charged: list[int]) -> LayerRecord:
        digest = result.diff_id
        final = self.path(digest)
        with self.lock:
            # the reservation becomes the layer's bytes in one step: never counted twice
            self._reserved -= charged[0]
            charged[0] = 0
            if not held:
                self._holds[digest] += 1
            if digest in self.layers:  # unpacked meanwhile by another path (a rootfs twin)
                self.touch((digest,))
                return self.record(digest)
            os.rename(tmp, final)  # a rename: atomic, and no copy under the lock
            self.layers[digest] = IndexedLayer(result.unpacked_bytes, time.time())
            self._used += result.unpacked_bytes
            record = self.record(digest)
        self._on_change()
        return record

    def evict(self, target_bytes: int) -> list[str]:
        """Remove unprotected, unheld layers LRU-first until the store holds ``target_bytes``
        plus what is being unpacked, or nothing more can go. Returns the removed digests."""
        protected = self._protected()
        with self.lock:
            keep = protected | set(self._holds) | set(self._flights)
            victims = select_victims({d: v.unpacked_bytes for d, v in self.layers.items()},
                                     {d: v.last_used for d, v in self.layers.items()},
                                     keep, self._used_locked() + self._reserved, target_bytes)
            moved = []
            for digest in victims:
                self._used -= self.layers.pop(digest).unpacked_bytes
                grave = self.tmp / f"{TEMP_MARK}gc-{digest.split(':', 1)[1]}-{os.getpid()}-{time.monotonic_ns()}"
                os.rename(self.path(digest), grave)  # a rename, so the index and the tree agree
                moved.append(grave)
        if victims:
            self._on_change()
        for grave in moved:
            shutil.rmtree(grave, ignore_errors=True)
        return victims

    def recover(self, indexed: dict[str, IndexedLayer]) -> None:
        """On open: remove half-unpacked temp dirs and layer dirs the index does not know; keep
        only index entries whose directory exists."""
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.tmp.mkdir(mode=0o700, exist_ok=True)
        for entry in self.tmp.iterdir():
            with contextlib.suppress(OSError):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        present = {p.name for p in self.dir.iterdir()}
        self.layers = {d: v for d, v in indexed.items() if d.split(":", 1)[1] in present}
        self._used = sum(v.unpacked_bytes for v in self.layers.values())
        known = {d.split(":", 1)[1] for d in self.layers}
        for name in present - known:
            shutil.rmtree(self.dir / name, ignore_errors=True)
