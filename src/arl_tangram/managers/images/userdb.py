"""Shell: resolve an image config's ``User`` against the image's own /etc/passwd and
/etc/group, read from its unpacked layers top-down with overlay semantics (whiteouts and
opaque dirs hide lower files). Nothing of the host's user database is consulted.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from arl_tangram.managers.images.errors import ImageError
from arl_tangram.managers.images.model import ID_RANGE

_MAX_DB_BYTES = 4 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def read_image_file(layers: Sequence[Path], rel: str) -> bytes | None:
    """The content of ``rel`` as the merged image shows it (None: absent, whited out, or not a
    regular file reachable without following a symlink). ``layers`` lowest first."""
    parts = [p for p in rel.split("/") if p]
    for layer in reversed(layers):
        found, stop = _in_layer(layer, parts)
        if found is not None or stop:
            return found
    return None


def _in_layer(layer: Path, parts: list[str]) -> tuple[bytes | None, bool]:
    """(content, stop): stop means lower layers are hidden (a whiteout or an opaque dir)."""
    try:
        fd = os.open(layer, _DIR)
    except OSError:
        return None, False
    opaque = False
    try:
        for i, comp in enumerate(parts):
            try:
                st = os.lstat(comp, dir_fd=fd)
            except FileNotFoundError:
                return None, opaque
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                return None, True  # a whiteout hides this path in every lower layer
            last = i == len(parts) - 1
            if last and stat.S_ISREG(st.st_mode):
                return _read(fd, comp), True
            if last or not stat.S_ISDIR(st.st_mode):
                return None, True
            nxt = os.open(comp, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
            with contextlib.suppress(OSError):
                opaque = opaque or os.getxattr(fd, "trusted.overlay.opaque") == b"y"
        return None, opaque
    finally:
        os.close(fd)


def _read(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, _MAX_DB_BYTES)
    finally:
        os.close(fd)


def _entries(data: bytes | None) -> list[list[str]]:
    if data is None:
        return []
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines() if line and not line.startswith("#")]


def _check_id(value: int, what: str, user: str, label: str) -> int:
    if not 0 <= value < ID_RANGE:
        raise ImageError("user", f"{label}: User {user!r}: {what} {value} is outside 0..{ID_RANGE - 1}")
    return value


def resolve_user(user: str, layers: Sequence[Path], label: str) -> tuple[int, int]:
    """(uid, gid) inside the namespace for ``user`` ("" = root; "name", "uid", "x:y" forms)."""
    if not user:
        return 0, 0
    name, _, group = user.partition(":")
    passwd = _entries(read_image_file(layers, "etc/passwd"))
    uid: int | None = None
    gid: int | None = None
    if name.isdigit():
        uid = int(name)
        gid = next((int(e[3]) for e in passwd if len(e) > 3 and e[2] == name and e[3].isdigit()), 0)
    else:
        entry = next((e for e in passwd if len(e) > 3 and e[0] == name), None)
        if entry is None or not entry[2].isdigit() or not entry[3].isdigit():
            raise ImageError("user", f"{label}: User {name!r} is not in the image's /etc/passwd", user)
        uid, gid = int(entry[2]), int(entry[3])
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            groups = _entries(read_image_file(layers, "etc/group"))
            match = next((e for e in groups if len(e) > 2 and e[0] == group and e[2].isdigit()), None)
            if match is None:
                raise ImageError("user", f"{label}: group {group!r} is not in the image's /etc/group", user)
            gid = int(match[2])
    return _check_id(uid, "uid", user, label), _check_id(gid, "gid", user, label)
