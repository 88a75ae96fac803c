"""Shell: a sandbox whose root is an image: ``ImageRoot`` (what the caller hands the CPU
manager; built by the agent from an image store record) and the argv that starts such a
sandbox.

The root is an overlay: the image's unpacked layers (read-only lowers, shared by every
sandbox on them) under a private writable upper on a tmpfs of ``writable_bytes``. Chosen over
sized backing files: a tmpfs needs no ``mkfs`` or loop device, which keeps warm creates
cheap. A tmpfs page is charged to the memory cgroup of the task that writes it, and writes
(copy-ups included) come from the sandbox's own tasks, so the writable layer counts as the
env's memory and ``mem_bytes`` bounds it as well (the exception: pages written by host-side
file calls are charged to the manager, as for the workspace; ``writable_bytes`` still caps them). Both mounts live in a mount namespace of
the sandbox's own (see ``rootfs_native``), so a dead sandbox leaves no mount behind.

Users: layers are unpacked with every owner shifted by ``UID_SHIFT``; each sandbox gets its
own user namespace mapping in-namespace 0..65535 to host ``UID_SHIFT``.. (one range shared by
all image sandboxes: safe because the lowers are read-only, each upper is reachable only from
its own mount namespace, and pid/ipc/net namespaces are per sandbox, so no sandbox can name
another's processes or writable files). The range must belong to no one else on the host
(no login user, no other runtime's /etc/subuid range). The task runs as the image's user,
e.g. root inside = host 100000, never host root.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arl_tangram.core.env_spec import UID_RANGE, UID_SHIFT
from arl_tangram.managers.cpu.errors import InvalidRequestError

#: in-namespace id 0 is host id UID_SHIFT; the store shifts layer owners by the same amount
#: (both read the core's constants, so they cannot drift apart).
ID_COUNT = UID_RANGE
#: where each sandbox mounts its tmpfs and overlay, inside its own mount namespace only
STAGE_DIR = "/run/arl-tangram-root"
INIT_PATH = "/dev/.tangram-init"  # the static init, bound read-only into /dev


@dataclass(frozen=True)
class ImageRoot:
    """An image root: ``lower_dirs`` LOWEST first (like ``ImageRecord.layers``), the image
    config's ``env`` and ``working_dir``, the user's in-namespace ``uid``/``gid``, and the cap
    of the writable layer in bytes."""

    lower_dirs: tuple[Path, ...]
    env: tuple[tuple[str, str], ...] = ()
    working_dir: str = "/"
    uid: int = 0
    gid: int = 0
    writable_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if not isinstance(self.lower_dirs, tuple) or not self.lower_dirs:
            raise InvalidRequestError("root.lower_dirs", "must be a non-empty tuple of directories", self.lower_dirs)
        if len(self.lower_dirs) > 500:
            raise InvalidRequestError("root.lower_dirs", "must hold at most 500 layers (overlayfs' limit)", len(self.lower_dirs))
        for d in self.lower_dirs:
            if not isinstance(d, Path) or not d.is_absolute() or not d.is_dir():
                raise InvalidRequestError("root.lower_dirs", "must be absolute paths of existing directories", d)
        if not isinstance(self.working_dir, str) or not self.working_dir.startswith("/") or "\0" in self.working_dir:
            raise InvalidRequestError("root.working_dir", "must be an absolute path", self.working_dir)
        for name in ("uid", "gid"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < ID_COUNT:
                raise InvalidRequestError(f"root.{name}", f"must be an integer in [0, {ID_COUNT})", v)
        w = self.writable_bytes
        if not isinstance(w, int) or isinstance(w, bool) or w < (1 << 20):
            raise InvalidRequestError("root.writable_bytes", "must be an integer >= 1048576", w)
        for pair in self.env:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) and "\0" not in x for x in pair)) or "=" in pair[0]:
                raise InvalidRequestError("root.env", "must be (name, value) string pairs, names without '='", pair)

    @property
    def host_uid(self) -> int:
        return UID_SHIFT + self.uid

    @property
    def host_gid(self) -> int:
        return UID_SHIFT + self.gid


def helper_argv(helper: str, join_files: Sequence[str], root: ImageRoot, bwrap: Sequence[str]) -> list[str]:
    """The helper's argv: join the cgroups, mount the root, make the user namespace, then
    exec ``bwrap`` (which names the namespace fd as "@USERNS@")."""
    os.makedirs(STAGE_DIR, mode=0o711, exist_ok=True)  # an empty mount point on the host
    return [
        helper, str(len(join_files)), *join_files, STAGE_DIR, str(root.writable_bytes), str(UID_SHIFT), str(ID_COUNT),
        str(len(root.lower_dirs)), *map(str, root.lower_dirs), "--", *bwrap,
    ]  # fmt: skip


def image_bwrap_argv(
    root: ImageRoot, *, hostname: str, dev_bytes: int, workspace: str, workspace_bytes: int, tmp_bytes: int, info_fd: int,
    ready_fd: int,
) -> list[str]:
    """bubblewrap for an image sandbox: joins the helper's user namespace (so it runs as the
    unprivileged host uid ``UID_SHIFT``), binds the overlay as ``/`` (writable: the upper is
    the sandbox's own), then the same /proc, minimal /dev, loopback-only network, private
    workspace and /tmp as a host-root sandbox. Its init is the helper's static ``init``, which
    writes one byte to ``ready_fd`` once it runs."""
    ws_perms = "0755" if root.uid == 0 else "1777"  # the tmpfs is created by in-namespace root
    return [
        "bwrap", "--userns", "@USERNS@", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        # the init stays in-namespace root (bwrap cannot switch ids inside a joined namespace);
        # actions switch to the image's user themselves (see native_launcher)
        "--uid", "0", "--gid", "0", "--hostname", hostname,
        "--bind", f"{STAGE_DIR}/root", "/",
        "--proc", "/proc", "--dev", "/dev", "--size", str(dev_bytes), "--tmpfs", "/dev/shm",
        "--ro-bind", f"{STAGE_DIR}/init", INIT_PATH,
        # the workspace and /tmp are directories of the overlay, not tmpfs mounts of their
        # own: the writable layer then holds everything the env can write, which is what a
        # snapshot freezes (``writable_bytes`` bounds all three; ``workspace_bytes`` and
        # ``tmp_bytes`` apply to host-root sandboxes only)
        "--perms", ws_perms, "--dir", workspace, "--perms", "1777", "--dir", "/tmp",
        "--dir", root.working_dir,  # made in the upper when the image lacks it, as Docker does
        "--chdir", "/", "--remount-ro", "/dev", "--new-session", "--info-fd", str(info_fd), "--", INIT_PATH, "init", str(ready_fd),
    ]  # fmt: skip
