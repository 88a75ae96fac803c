"""Shell: the byte pipeline of one layer: metered, hashed reading of the blob, decompression
(gzip, zstd, none; told apart by magic bytes), and the caps checked chunk by chunk.

``unpack_blob`` is the one entry point: it verifies the blob digest (compressed), the
diff_id (uncompressed) and the declared size, and refuses a layer the moment a cap is
passed (a bomb never finishes unpacking). Errors name the layer.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from arl_tangram.managers.images.errors import LayerRefusedError
from arl_tangram.managers.images.unpack import unpack_tar

_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

Charge = Callable[[int], None]  # told each chunk's size; raises to stop the unpack


class MeteredReader(io.RawIOBase):
    """A raw reader that hashes and counts what passes and tells ``charge`` each chunk."""

    def __init__(self, source: BinaryIO, charge: Charge | None = None, hashing: bool = True) -> None:
        self._source = source
        self._charge = charge
        self._hashing = hashing
        self.sha = hashlib.sha256()
        self.num_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        n = self._source.readinto(buffer)  # type: ignore[attr-defined]
        if not n:
            return 0
        self.num_bytes += n
        if self._charge is not None:
            self._charge(n)
        if self._hashing:
            self.sha.update(memoryview(buffer)[:n])
        return n

    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


class IterReader(io.RawIOBase):
    """A raw reader over an iterator of byte chunks (an HTTP response body)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        while not self._pending:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._pending = nxt
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


@dataclass(frozen=True)
class BlobResult:
    """What one unpacked blob was: its digests and sizes."""

    blob_digest: str
    diff_id: str
    blob_bytes: int
    unpacked_bytes: int


def unpack_blob(
    raw: BinaryIO,
    dest: Path,
    label: str,
    *,
    declared_bytes: int | None = None,
    blob_digest: str | None = None,
    diff_id: str | None = None,
    charge_unpacked: Charge | None = None,
    on_fetched: Charge | None = None,
) -> BlobResult:
    """Unpack the layer blob read from ``raw`` into the empty dir ``dest``; verify it after.

    ``declared_bytes``/``blob_digest`` are the descriptor's size and digest (compressed),
    ``diff_id`` the config's uncompressed digest (any of them may be unknown: None).
    ``charge_unpacked`` sees every uncompressed chunk (per-layer cap, store quota).
    """
    def charge_fetched(n: int) -> None:
        if declared_bytes is not None and compressed.num_bytes > declared_bytes:
            raise LayerRefusedError("layer", f"{label}: larger than its declared size of {declared_bytes} bytes")
        if on_fetched is not None:
            on_fetched(n)

    compressed = MeteredReader(raw, charge_fetched)
    buffered = io.BufferedReader(compressed, _CHUNK)
    try:
        with _decompressed(buffered, label) as plain:
            # an uncompressed blob's digest is its diff_id: hash those bytes once, not twice
            tar_in = MeteredReader(plain, charge_unpacked, hashing=plain is not buffered)
            # big reads go straight through the buffer into the unpacker's; headers are buffered
            unpack_tar(io.BufferedReader(tar_in, _CHUNK), dest, label)
            while tar_in.read(_CHUNK):  # trailing padding still counts in the diff_id
                pass
    except LayerRefusedError as exc:
        # a corrupt stream usually shows as a gzip/tar error first: name the root cause
        # (a blob that is not the one the manifest names) when the blob's own check says so
        raise _blob_cause(buffered, compressed, label, declared_bytes, blob_digest) or exc from None
    cause = _blob_cause(buffered, compressed, label, declared_bytes, blob_digest)
    if cause is not None:
        raise cause
    tar_digest = tar_in.digest() if plain is not buffered else compressed.digest()
    if diff_id is not None and tar_digest != diff_id:
        raise LayerRefusedError("layer", f"{label}: diff_id mismatch: tar is {tar_digest}, expected {diff_id}")
    return BlobResult(compressed.digest(), tar_digest, compressed.num_bytes, tar_in.num_bytes)


def _blob_cause(buffered: io.BufferedReader[MeteredReader], compressed: MeteredReader, label: str, declared_bytes: int | None,
                blob_digest: str | None) -> LayerRefusedError | None:
    """Read the blob to its end (bounded by the declared size) and say what is wrong with it."""
    try:
        while buffered.read(_CHUNK):
            pass
    except LayerRefusedError as exc:
        return exc
    except (OSError, ValueError):
        return None
    if declared_bytes is not None and compressed.num_bytes > declared_bytes:
        return LayerRefusedError("layer", f"{label}: larger than its declared size of {declared_bytes} bytes")
    if declared_bytes is not None and compressed.num_bytes < declared_bytes:
        return LayerRefusedError(
            "layer", f"{label}: truncated: {compressed.num_bytes} of its declared {declared_bytes} bytes")
    if blob_digest is not None and compressed.digest() != blob_digest:
        return LayerRefusedError("layer", f"{label}: digest mismatch: blob is {compressed.digest()}, expected {blob_digest}")
    return None


@contextlib.contextmanager
def _decompressed(buffered: io.BufferedReader[MeteredReader], label: str) -> Iterator[BinaryIO]:
    magic = buffered.peek(4)[:4]
    if magic.startswith(_GZIP_MAGIC):
        with gzip.GzipFile(fileobj=buffered, mode="rb") as gz:
            try:
                yield gz  # type: ignore[misc]
            except (EOFError, gzip.BadGzipFile, OSError) as exc:
                if isinstance(exc, LayerRefusedError):
                    raise
                raise LayerRefusedError("layer", f"{label}: truncated or corrupt gzip: {exc}") from None
    elif magic == _ZSTD_MAGIC:
        with _zstd(buffered, label) as out:
            yield out
    else:
        yield buffered  # type: ignore[misc]


@contextlib.contextmanager
def _zstd(buffered: io.BufferedReader[MeteredReader], label: str) -> Iterator[BinaryIO]:
    """zstd through the ``zstd`` binary: a feeder thread writes the blob, we read the tar."""
    zstd = shutil.which("zstd")
    if zstd is None:
        raise LayerRefusedError("layer", f"{label}: zstd-compressed, and no zstd binary is installed")
    proc = subprocess.Popen([zstd, "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    failure: list[BaseException] = []

    def feed() -> None:
        try:
            while chunk := buffered.read(_CHUNK):
                proc.stdin.write(chunk)  # type: ignore[union-attr]
        except BaseException as exc:  # handed to the reader thread, which re-raises it
            failure.append(exc)
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]

    feeder = threading.Thread(target=feed, name=f"zstd-feed-{label[:24]}", daemon=True)
    feeder.start()
    ok = False
    try:
        yield proc.stdout  # type: ignore[misc]
        ok = True
    finally:
        if not ok:
            proc.kill()
        proc.stdout.close()
        feeder.join()
        rc = proc.wait()
        if failure and isinstance(failure[0], LayerRefusedError):
            raise failure[0]  # the cause (over the declared size) beats the tar error it made
    if rc != 0 or failure:
        raise LayerRefusedError("layer", f"{label}: truncated or corrupt zstd (zstd exit {rc})")
