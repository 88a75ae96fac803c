"""Shell: path resolution confined to a sandbox's root, for host-side file calls on image
sandboxes (any absolute path inside the image may be named there, symlinks included).

Every lookup is one ``openat2(root_fd, path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``: the
kernel resolves ``..`` and every symlink (absolute ones too) as if ``root_fd`` were ``/``, so
an image's ``/etc/passwd -> /etc/shadow`` reads the image's shadow or nothing, never the
host's, and ``/proc`` magic links cannot lead out. Without ``openat2`` (an old kernel or an
unknown architecture) the call is refused: there is no fallback to an unconfined open.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterator

from arl_tangram.managers.cpu.errors import CpuManagerError

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_in_root(root_fd: int, parts: tuple[str, ...], flags: int, mode: int = 0) -> int:
    """fd of ``parts`` (components below the root) opened with ``flags``, resolved inside
    ``root_fd``; raises ``OSError`` like ``os.open``."""
    if _SYS_OPENAT2 is None:
        raise CpuManagerError(f"in-root file calls need openat2, unknown on {platform.machine()}: refused")
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    path = ("/".join(parts) or ".").encode()
    fd = _libc.syscall(_SYS_OPENAT2, ctypes.c_int(root_fd), ctypes.c_char_p(path), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        if err == 38:  # ENOSYS
            raise CpuManagerError("in-root file calls need openat2 (Linux >= 5.6): refused")
        raise OSError(err, os.strerror(err), "/" + "/".join(parts))
    return int(fd)


@contextlib.contextmanager
def dir_in_root(root_fd: int, parts: tuple[str, ...], create: bool) -> Iterator[int]:
    """fd of directory ``parts`` resolved inside the root; with ``create`` missing
    components are made (0755) one at a time, each step resolved inside the root again."""
    flags = os.O_PATH | os.O_DIRECTORY
    try:
        fd = open_in_root(root_fd, parts, flags)
    except FileNotFoundError:
        if not create:
            raise
        fd = open_in_root(root_fd, (), flags)
        for i, name in enumerate(parts):
            # Another writer may create it between our open and mkdir: that is fine.
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            os.close(fd)
            fd = open_in_root(root_fd, parts[: i + 1], flags)
    try:
        yield fd
    finally:
        os.close(fd)
