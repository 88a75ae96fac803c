"""Shell: file read/write/upload/download inside a sandbox, done from the host side.

The host reaches the sandbox's private tmpfs through ``/proc/<init>/root`` (works while the
sandbox is frozen, costs no grant). Two rules keep this safe against a hostile sandbox:
  * paths are walked one component at a time with ``O_NOFOLLOW`` from the sandbox root fd,
    so a symlink planted by the sandbox can never redirect a host-side write or read;
  * the calling thread's fsuid/fsgid are switched to the sandbox user's host ids, so files
    get the right owner (a tmpfs mounted in a user namespace refuses unmapped owners) and the
    host process has no more file rights than the sandbox user.
Only paths under the sandbox's workspace or ``/tmp`` are accepted on the host root. On an
image root any path inside the image may be named (not /proc, /sys or /dev): it is resolved
by ``inroot`` (``openat2`` with ``RESOLVE_IN_ROOT``), so symlinks are followed but only ever
inside the sandbox's root, and files get the image user's shifted owner. And a hostile sandbox
cannot turn a file call against the host: only regular files are opened, never blocking
(a planted FIFO is refused, not waited on), reads are capped by the file's size *before*
reading (a sparse 200 GiB file is refused, not loaded), writes go to a temporary file that
is renamed over the target (readers never see torn contents; a FIFO or symlink at the
target is replaced, never opened), and the root fd comes from ``Sandbox.open_root`` (pidfd
checked, so a recycled pid cannot redirect the call into another process's root).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import posixpath
import secrets
import stat
from collections.abc import Iterable, Iterator

from arl_tangram.managers.cpu.errors import ConflictError, InvalidRequestError
from arl_tangram.managers.cpu.inroot import dir_in_root, open_in_root
from arl_tangram.managers.cpu.launch import SandboxLayout

_libc = ctypes.CDLL(None, use_errno=True)
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KERNEL_DIRS = ("/proc", "/sys", "/dev")  # the sandbox's kernel views, not files of the image


def sandbox_path(path: str, layout: SandboxLayout, field: str = "path") -> tuple[str, ...]:
    """Validate ``path`` (absolute, or relative to the default cwd) and split it into
    components below ``/``. On the host root it must stay inside the workspace or ``/tmp``;
    on an image root anywhere but /proc, /sys and /dev."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise InvalidRequestError(field, "must be a non-empty string without NUL bytes", path)
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(layout.default_cwd, path))
    full = "/" + full.lstrip("/")  # normpath keeps a leading "//"
    if layout.root is not None:
        if any(full == k or full.startswith(k + "/") for k in _KERNEL_DIRS):
            raise InvalidRequestError(field, "must not be under /proc, /sys or /dev", path)
        return tuple(p for p in full.split("/") if p)
    roots = (layout.workspace, "/tmp")
    if not any(full == r or full.startswith(r + "/") for r in roots):
        raise InvalidRequestError(field, f"must stay inside {layout.workspace} or /tmp", path)
    return tuple(p for p in full.split("/") if p)


@contextlib.contextmanager
def _as_sandbox_user(layout: SandboxLayout) -> Iterator[None]:
    """fsuid/fsgid are per thread in Linux, so this affects only the calling thread."""
    _libc.setfsgid(layout.host_gid)
    _libc.setfsuid(layout.host_uid)
    try:
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)


@contextlib.contextmanager
def _walk(root_dir: str, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """fd of the directory ``parts`` (relative to the sandbox root), never following links."""
    fds = [os.open(root_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]  # a /proc/self/fd path
    try:
        for name in parts:
            try:
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
            except FileNotFoundError:
                if not create:
                    raise
                # Another writer may create it between our open and mkdir: that is fine.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fds[-1])
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


# for modules that stream into a sandbox (spool): the same two safety rules
as_sandbox_user = _as_sandbox_user
walk_dir = _walk


def _parent(root_fd: int, layout: SandboxLayout, parts: tuple[str, ...], create: bool) -> contextlib.AbstractContextManager[int]:
    """The directory ``parts`` names: resolved inside the root on an image, else walked
    without following any link."""
    if layout.root is not None:
        return dir_in_root(root_fd, parts, create)
    return _walk(f"/proc/self/fd/{root_fd}", parts, create)


def _leaf(root_fd: int, dfd: int, layout: SandboxLayout, parts: tuple[str, ...], flags: int) -> int:
    """Open the last component: through symlinks inside the root on an image, else never
    through a link."""
    if layout.root is not None:
        return open_in_root(root_fd, parts, flags)
    return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)


def _need_leaf(parts: tuple[str, ...], path: str) -> None:
    if not parts:
        raise InvalidRequestError("path", "must name a file below /", path)


def _mapped(exc: OSError, path: str) -> Exception:
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(f"no such file in the sandbox: {path}")
    if exc.errno == 28:  # the tenant's own quota: bad input for this call, not a failure
        return ConflictError("path", "must fit the sandbox's free space (its workspace, /tmp or writable layer is full)", path)
    if exc.errno == 40 or isinstance(exc, NotADirectoryError):
        return ConflictError("path", "must not pass through a symlink or a non-directory", path)
    return exc


def write_file(root_fd: int, layout: SandboxLayout, path: str, data: bytes, mode: int = 0o644) -> None:
    """Create or atomically replace the file at ``path`` (parents created); O(len(data))."""
    write_stream(root_fd, layout, path, (data,), len(data), mode)


def write_stream(root_fd: int, layout: SandboxLayout, path: str, chunks: Iterable[bytes], cap_bytes: int, mode: int = 0o644) -> int:
    """``write_file`` from chunks as they come (a streamed upload, a zip member): at most
    ``cap_bytes`` in all, else nothing is left behind; returns the bytes written."""
    parts = sandbox_path(path, layout)
    _need_leaf(parts, path)
    if layout.root is None and (len(parts) == 1 or "/" + "/".join(parts) == layout.workspace):
        raise ConflictError("path", f"must name a file below {layout.workspace} or /tmp, not the directory itself", path)
    written = 0
    try:
        with _as_sandbox_user(layout), _parent(root_fd, layout, parts[:-1], create=True) as dfd:
            tmp = f".tangram-tmp-{secrets.token_hex(6)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode & 0o777, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as f:
                    for chunk in chunks:
                        written += len(chunk)
                        if written > cap_bytes:
                            raise InvalidRequestError("data", f"must be at most {cap_bytes} bytes", written)
                        f.write(chunk)
                os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
    except OSError as exc:
        raise _mapped(exc, path) from exc
    return written


def read_file(root_fd: int, layout: SandboxLayout, path: str, cap_bytes: int, max_bytes: int | None = None) -> bytes:
    """The contents of the regular file at ``path``: at most ``max_bytes`` when given (a
    prefix), else the whole file, refused when it is larger than ``cap_bytes``."""
    parts = sandbox_path(path, layout)
    _need_leaf(parts, path)
    try:
        with _as_sandbox_user(layout), _parent(root_fd, layout, parts[:-1], create=False) as dfd:
            fd = _leaf(root_fd, dfd, layout, parts, os.O_RDONLY | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ConflictError("path", "must name a regular file", path)
                want = cap_bytes if max_bytes is None else min(max_bytes, cap_bytes)
                if max_bytes is None and st.st_size > cap_bytes:
                    raise ConflictError("path", f"file is {st.st_size} bytes, over the cap of {cap_bytes} (config.max_file_bytes)", path)
                data = f.read(want + 1)
                if len(data) > want and max_bytes is None:
                    raise ConflictError("path", f"file grew over the cap of {cap_bytes} bytes while read", path)
                return data[:want]
    except OSError as exc:
        raise _mapped(exc, path) from exc


def is_regular(root_fd: int, layout: SandboxLayout, path: str) -> bool:
    """Whether ``path`` names a regular file (no link followed, nothing opened)."""
    parts = sandbox_path(path, layout)
    _need_leaf(parts, path)
    try:
        with _as_sandbox_user(layout):
            if layout.root is not None:
                fd = open_in_root(root_fd, parts, os.O_PATH)
                try:
                    return stat.S_ISREG(os.fstat(fd).st_mode)
                finally:
                    os.close(fd)
            with _walk(f"/proc/self/fd/{root_fd}", parts[:-1], create=False) as dfd:
                return stat.S_ISREG(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError as exc:
        raise _mapped(exc, path) from exc


def list_tree(root_fd: int, layout: SandboxLayout, path: str) -> list[tuple[str, bool]]:
    """(relative path, is_dir) of everything below directory ``path``, parents first
    (regular files and directories only)."""
    parts = sandbox_path(path, layout)
    out: list[tuple[str, bool]] = []
    try:
        with _as_sandbox_user(layout), _parent(root_fd, layout, parts, create=False) as dfd:
            _scan(dfd, "", out)
    except OSError as exc:
        raise _mapped(exc, path) from exc
    return out


def _scan(dfd: int, prefix: str, out: list[tuple[str, bool]]) -> None:
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        with os.scandir(fd) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in it)
    finally:
        os.close(fd)
    for name, is_dir, is_file in entries:
        rel = f"{prefix}{name}"
        if is_dir:
            out.append((rel, True))
            sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            try:
                _scan(sub, rel + "/", out)
            finally:
                os.close(sub)
        elif is_file:
            out.append((rel, False))


def require_dir(root_fd: int, layout: SandboxLayout, path: str, field: str) -> None:
    """``ConflictError`` naming ``field`` unless ``path`` is a directory (no link followed on
    the host root; resolved inside the root on an image)."""
    parts = sandbox_path(path, layout, field)
    try:
        with _as_sandbox_user(layout), _parent(root_fd, layout, parts, create=False):
            return
    except OSError:
        raise ConflictError(field, "must name an existing directory in the sandbox (no symlink on the way)", path) from None
