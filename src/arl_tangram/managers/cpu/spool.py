"""Shell: an upload streamed into a sandbox chunk by chunk, spooled in the sandbox's own /tmp.

Who calls: ``CpuManager.open_spool`` (the SWE-ReX face's ``upload``), each method on a worker
thread. The bytes never rest on the host: they go, as they arrive, to a private file in the
sandbox's ``/tmp``, so an upload counts against that sandbox's own quota (a full ``/tmp``
refuses it: ``InvalidRequestError``) and against ``max_bytes``. ``place`` then puts the
spool at its target (as a file, or unpacked as a zip archive, every member through
``files.write_stream``: regular files only, no link followed, the total bounded) and
``close`` removes the spool; ``close`` is idempotent and always safe to call. The spool file
is opened once with ``O_EXCL | O_NOFOLLOW`` and used by its fd after that, so what the
sandbox does to the name meanwhile cannot redirect a host-side read or write.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import zipfile
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from arl_tangram.managers.cpu import files
from arl_tangram.managers.cpu.errors import ConflictError, InvalidRequestError
from arl_tangram.managers.cpu.sandbox import Sandbox

_CHUNK_BYTES = 1 << 20


class Spool:
    """One upload's spool in one sandbox (not thread-safe: one caller at a time)."""

    def __init__(self, sb: Sandbox, max_bytes: int) -> None:
        self._sb, self._max_bytes, self.size = sb, max_bytes, 0
        self._name = f".tangram-upload-{secrets.token_hex(8)}"
        self._root = sb.open_root()
        self._fd = -1
        try:
            with files.as_sandbox_user(sb.layout), files.walk_dir(f"/proc/self/fd/{self._root}", ("tmp",), create=False) as dfd:
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                self._fd = os.open(self._name, flags, 0o600, dir_fd=dfd)
        except BaseException:
            os.close(self._root)
            raise

    def write(self, data: bytes) -> None:
        """Append ``data``; past ``max_bytes`` or the sandbox's free /tmp: ``InvalidRequestError``."""
        self.size += len(data)
        if self.size > self._max_bytes:
            raise InvalidRequestError("file", f"must be at most {self._max_bytes} bytes", self.size)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if exc.errno == 28:
                raise ConflictError("file", "must fit the sandbox's free space in /tmp (the upload is spooled there)", self.size) from None
            raise

    def place(self, target: str, unzip: bool, max_total_bytes: int) -> int:
        """Put the spool at ``target`` (a file, or a zip archive's members under it, at most
        ``max_total_bytes`` unpacked); returns the files written. A broken archive is the
        caller's error (``InvalidRequestError``)."""
        try:
            return self._place(target, unzip, max_total_bytes)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise InvalidRequestError("file", f"must be a readable zip archive ({exc})") from None

    def _place(self, target: str, unzip: bool, max_total_bytes: int) -> int:
        os.lseek(self._fd, 0, os.SEEK_SET)
        if not unzip:
            files.write_stream(self._root, self._sb.layout, target, self._chunks(), self._max_bytes)
            return 1
        count, total = 0, 0
        with os.fdopen(os.dup(self._fd), "rb") as raw, _archive(raw) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                with archive.open(info) as member:
                    chunks = iter(lambda m=member: m.read(_CHUNK_BYTES), b"")  # type: ignore[misc]
                    path = f"{target.rstrip('/')}/{info.filename}"
                    total += files.write_stream(self._root, self._sb.layout, path, chunks, max_total_bytes - total)
                count += 1
        return count

    def _chunks(self) -> Iterator[bytes]:
        while chunk := os.read(self._fd, _CHUNK_BYTES):
            yield chunk

    def close(self) -> None:
        if self._root < 0:
            return
        layout, root_dir = self._sb.layout, f"/proc/self/fd/{self._root}"
        with contextlib.suppress(OSError), files.as_sandbox_user(layout), files.walk_dir(root_dir, ("tmp",), create=False) as dfd:
            os.unlink(self._name, dir_fd=dfd)
        for fd in (self._fd, self._root):
            if fd >= 0:
                os.close(fd)
        self._fd = self._root = -1


@contextlib.contextmanager
def _archive(raw: BinaryIO) -> Iterator[zipfile.ZipFile]:
    try:
        archive = zipfile.ZipFile(raw)
    except zipfile.BadZipFile as exc:
        raise InvalidRequestError("file", f"must be a zip archive when unzip is true ({exc})") from None
    with archive:
        yield archive
