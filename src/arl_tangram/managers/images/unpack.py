"""Shell: the hostile-layer-safe tar unpacker. Writes one layer into an empty directory in
overlayfs form, owning every path decision itself (``tarfile`` only parses headers).

Contract: every member is refused (``LayerRefusedError`` naming the layer and the member) or
contained; nothing lands outside ``dest``. The rules, each for a reason:
- paths are made relative (leading ``/`` dropped) and any ``..`` component refuses the layer;
- every parent is walked from ``dest`` with ``O_NOFOLLOW`` dir fds, so a symlink in the
  path (one swapped in mid-archive, or any other) refuses the layer instead of being
  followed; an existing entry is unlinked before a new one is made ``O_EXCL``, so nothing is
  ever written through a symlink or a hardlink already there;
- hardlinks must name a regular file already unpacked in this layer (never a host file);
- char/block devices are not created (skipped with a warning; a sandbox gets its own /dev);
  the only device nodes are the 0:0 whiteouts made here from OCI ``.wh.`` names, and
  ``.wh..wh..opq`` becomes ``trusted.overlay.opaque=y``: hostile layers cannot set those
  because only ``user.*`` xattrs from the tar are kept (``trusted.*``, ``security.*``
  including ``security.capability`` are dropped);
- uids/gids are shifted by ``UID_SHIFT``; ids >= ``ID_RANGE`` refuse the layer. setuid/setgid
  bits are kept (an image's ``su`` works inside its namespace): a setuid file is owned by a
  shifted id, so it can only ever grant an unprivileged host uid, and the store is 0700 root
  so no host user can reach it outside a sandbox;
- sparse members refuse the layer (their holes would let a small tar write huge files).
Byte caps (declared size, per-layer cap, store quota) are enforced by the stream that feeds
this function (``streams.py``), chunk by chunk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from arl_tangram.managers.images.errors import LayerRefusedError
from arl_tangram.managers.images.model import ID_RANGE, UID_SHIFT

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPAQUE = ".wh..wh..opq"
_WHITEOUT = ".wh."
_KEPT_XATTR_PREFIX = "user."
_CHUNK = 1 << 20


@dataclass(frozen=True)
class UnpackStats:
    """What one unpack made: entries written, data bytes, devices skipped."""

    num_entries: int
    data_bytes: int
    num_skipped_devices: int


def split_member_path(name: str, label: str) -> tuple[str, ...]:
    """The member's path as components relative to the layer root; ``..`` refuses the layer."""
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise LayerRefusedError("layer", f"{label}: member {name!r} escapes the layer ('..' in its path)")
    return parts


class _Tree:
    """Dir-fd walks inside one layer directory; never follows a symlink."""

    def __init__(self, root: Path, label: str) -> None:
        self.label = label
        self.root_fd = os.open(root, _DIR_FLAGS)
        self._cached: tuple[tuple[str, ...], int] | None = None

    def close(self) -> None:
        self.forget()
        os.close(self.root_fd)

    def forget(self) -> None:
        """Drop the cached parent fd (after a removal, it may name a replaced directory)."""
        if self._cached is not None:
            os.close(self._cached[1])
            self._cached = None

    def parent(self, parts: tuple[str, ...], name: str, create: bool = True) -> int:
        """An fd of directory ``parts`` (borrowed: do not close), made 0755 if missing."""
        if self._cached is not None and self._cached[0] == parts:
            return self._cached[1]
        self.forget()
        fd = os.dup(self.root_fd)
        try:
            for comp in parts:
                fd = self._step(fd, comp, name, create)
        except BaseException:
            os.close(fd)
            raise
        self._cached = (parts, fd)
        return fd

    def _step(self, fd: int, comp: str, name: str, create: bool) -> int:
        """The fd of ``comp`` under ``fd`` (which it closes on success; the caller on error)."""
        try:
            nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise self.refuse(name, f"names {comp!r}, which is not in this layer") from None
            os.mkdir(comp, 0o755, dir_fd=fd)
            nxt = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            os.fchown(nxt, UID_SHIFT, UID_SHIFT)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self.refuse(name, f"goes through {comp!r}, a symlink or non-directory: refused") from None
            raise
        os.close(fd)
        return nxt

    def clear(self, parent_fd: int, base: str, keep_dir: bool) -> None:
        """Remove what is at ``base`` so a new entry can be made (a directory stays if ``keep_dir``)."""
        try:
            st = os.lstat(base, dir_fd=parent_fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            shutil.rmtree(base, dir_fd=parent_fd)
        else:
            os.unlink(base, dir_fd=parent_fd)

    def refuse(self, name: str, rule: str) -> LayerRefusedError:
        return LayerRefusedError("layer", f"{self.label}: member {name!r} {rule}")


class _ForwardReader:
    """A forward-only "seekable" view of a stream, for tarfile's ``r:`` mode: members are read
    in order, so every seek goes forward (skipped bytes are read and dropped). tarfile's own
    stream mode (``r|``) re-slices its whole buffer on every header read, which made
    many-small-file layers several times slower."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._pos += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        n = self._stream.readinto(buffer)  # type: ignore[attr-defined]
        self._pos += n
        return n

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        target = pos if whence == 0 else self._pos + pos
        if whence not in (0, 1) or target < self._pos:
            raise OSError(errno.ESPIPE, "layer streams only seek forward")
        while self._pos < target:
            if not self.read(min(_CHUNK, target - self._pos)):
                break
        return self._pos


def unpack_tar(stream: BinaryIO, dest: Path, label: str) -> UnpackStats:
    """Unpack the (decompressed) tar ``stream`` into the empty directory ``dest``.

    ``label`` names the layer in errors. On error ``dest`` holds a partial tree: the caller
    unpacks into a temp dir and removes it (nothing is renamed into place on failure).
    """
    os.chown(dest, UID_SHIFT, UID_SHIFT)
    os.chmod(dest, 0o755)
    tree = _Tree(dest, label)
    entries = data = skipped = 0
    try:
        reader = _ForwardReader(stream)
        buffer = memoryview(bytearray(_CHUNK))
        with tarfile.open(fileobj=reader, mode="r:") as tf:  # type: ignore[call-overload]
            for member in tf:
                entries += 1
                written, was_skipped = _one_member(reader, buffer, member, tree)
                data += written
                skipped += was_skipped
    except tarfile.TarError as exc:
        raise LayerRefusedError("layer", f"{label}: not a valid tar (truncated or corrupt): {exc}") from None
    except EOFError as exc:
        raise LayerRefusedError("layer", f"{label}: truncated: {exc}") from None
    except OSError as exc:
        raise LayerRefusedError("layer", f"{label}: unpack failed: {exc.strerror or exc}") from None
    finally:
        tree.close()
    return UnpackStats(num_entries=entries, data_bytes=data, num_skipped_devices=skipped)


def _one_member(reader: _ForwardReader, buffer: memoryview, member: tarfile.TarInfo, tree: _Tree) -> tuple[int, int]:
    """Apply one member; returns (data bytes written, 1 if a device was skipped)."""
    name = member.name
    parts = split_member_path(name, tree.label)
    if not parts:  # the layer root itself: only its metadata
        if member.isdir():
            _apply_meta(tree.root_fd, member, tree)
        return 0, 0
    if member.issparse():
        raise tree.refuse(name, "is a sparse file: refused (holes could expand past the byte caps)")
    parent = tree.parent(parts[:-1], name)
    base = parts[-1]
    if base == _OPAQUE:
        os.setxattr(parent, "trusted.overlay.opaque", b"y")
        return 0, 0
    if base.startswith(_WHITEOUT + _WHITEOUT):
        return 0, 0  # other aufs metadata (.wh..wh.plnk ...) means nothing to overlayfs
    if base.startswith(_WHITEOUT):
        _whiteout(parent, base[len(_WHITEOUT):], name, tree)
        return 0, 0
    if member.ischr() or member.isblk():
        log.warning("%s: device node %r skipped (devices are not created from layers)", tree.label, name)
        return 0, 1
    if member.isdir():
        _directory(parent, base, member, tree)
        return 0, 0
    # the cached fd is this member's parent, never under what is removed: it stays valid
    tree.clear(parent, base, keep_dir=False)
    if member.isreg():
        return _regular(reader, buffer, parent, base, member, tree), 0
    if member.issym():
        _symlink(parent, base, member, tree)
    elif member.islnk():
        _hardlink(parent, base, member, tree)
    elif member.isfifo():
        os.mkfifo(base, 0o600, dir_fd=parent)
        fd = os.open(base, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            _apply_meta(fd, member, tree)
        finally:
            os.close(fd)
    else:
        log.warning("%s: member %r of tar type %r skipped", tree.label, name, member.type)
    return 0, 0


def _whiteout(parent: int, target: str, name: str, tree: _Tree) -> None:
    if target in ("", ".", ".."):
        raise tree.refuse(name, "is a whiteout of nothing")
    tree.clear(parent, target, keep_dir=False)
    os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=parent)


def _directory(parent: int, base: str, member: tarfile.TarInfo, tree: _Tree) -> None:
    try:
        st = os.lstat(base, dir_fd=parent)
        if not stat.S_ISDIR(st.st_mode):
            tree.clear(parent, base, keep_dir=False)
            os.mkdir(base, 0o700, dir_fd=parent)
    except FileNotFoundError:
        os.mkdir(base, 0o700, dir_fd=parent)
    fd = os.open(base, _DIR_FLAGS, dir_fd=parent)
    try:
        _apply_meta(fd, member, tree, set_times=False)
    finally:
        os.close(fd)


def _regular(reader: _ForwardReader, buffer: memoryview, parent: int, base: str, member: tarfile.TarInfo,
             tree: _Tree) -> int:
    """Copy the member's data straight from the stream (tarfile's own file objects add two
    more copies); tarfile then seeks forward past the padding to the next header."""
    fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
    left = member.size
    try:
        reader.seek(member.offset_data)
        while left > 0:
            n = reader.readinto(buffer[: min(len(buffer), left)])
            if n <= 0:
                raise tree.refuse(member.name, f"is truncated ({left} of {member.size} bytes missing)")
            os.write(fd, buffer[:n])
            left -= n
        _apply_meta(fd, member, tree)
    finally:
        os.close(fd)
    return member.size


def _symlink(parent: int, base: str, member: tarfile.TarInfo, tree: _Tree) -> None:
    target = member.linkname
    if not target or len(target) >= 4096:
        raise tree.refuse(member.name, "is a symlink with an empty or over-long target")
    # the target is stored as text and only ever resolved inside a sandbox's own root
    os.symlink(target, base, dir_fd=parent)
    uid, gid = _shifted_ids(member, tree)
    os.chown(base, uid, gid, dir_fd=parent, follow_symlinks=False)


def _hardlink(parent: int, base: str, member: tarfile.TarInfo, tree: _Tree) -> None:
    target = split_member_path(member.linkname, tree.label)
    if not target:
        raise tree.refuse(member.name, "is a hardlink to the layer root")
    dest_fd = os.dup(parent)  # the target's walk replaces the borrowed, cached parent fd
    try:
        tparent = tree.parent(target[:-1], member.name, create=False)
        try:
            st = os.lstat(target[-1], dir_fd=tparent)
        except FileNotFoundError:
            raise tree.refuse(member.name, f"is a hardlink to {member.linkname!r}, which is not in this layer") from None
        if not stat.S_ISREG(st.st_mode):
            raise tree.refuse(member.name, f"is a hardlink to {member.linkname!r}, which is not a regular file")
        os.link(target[-1], base, src_dir_fd=tparent, dst_dir_fd=dest_fd, follow_symlinks=False)
    finally:
        os.close(dest_fd)


def _shifted_ids(member: tarfile.TarInfo, tree: _Tree) -> tuple[int, int]:
    if not (0 <= member.uid < ID_RANGE and 0 <= member.gid < ID_RANGE):
        raise tree.refuse(member.name, f"has uid:gid {member.uid}:{member.gid}; ids must be < {ID_RANGE}")
    return member.uid + UID_SHIFT, member.gid + UID_SHIFT


def _apply_meta(fd: int, member: tarfile.TarInfo, tree: _Tree, set_times: bool = True) -> None:
    """Owner (shifted), then mode (chown clears setuid bits, so mode comes second), xattrs, mtime."""
    uid, gid = _shifted_ids(member, tree)
    os.fchown(fd, uid, gid)
    os.chmod(fd, member.mode & 0o7777)
    for key, value in member.pax_headers.items():
        if key.startswith("SCHILY.xattr."):
            xname = key[len("SCHILY.xattr."):]
            if xname.startswith(_KEPT_XATTR_PREFIX):
                with contextlib.suppress(OSError):  # a filesystem without user xattrs loses them
                    os.setxattr(fd, xname, value.encode("utf-8", "surrogateescape"))
    if set_times:
        mtime_ns = int(member.mtime * 1e9)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
