"""Test images made from the host's own files: a tiny root filesystem (bash, coreutils bits,
procps, python3 with a trimmed stdlib) chown-shifted by ``UID_SHIFT`` as the image store
would unpack it. Built in a few hundred milliseconds, no network."""

from __future__ import annotations

import os
from pathlib import Path

from arl_tangram.bench.image_kit import copy_host_root
from arl_tangram.core.env_spec import UID_SHIFT

BINS = (
    "bash", "sh", "cat", "ls", "echo", "id", "env", "sleep", "true", "false", "mkdir", "rm", "cp",
    "mv", "touch", "head", "tail", "df", "seq", "wc", "tr", "grep", "pgrep", "ps", "kill", "nohup",
    "setsid", "timeout", "truncate", "mkfifo", "pwd", "stat", "python3", "readlink", "ln", "chmod",
    "sed", "dd", "whoami", "uname", "nproc",
)


def build_base(root: Path) -> Path:
    """A merged-/usr base image at ``root`` (which must not exist yet); returns it."""
    copy_host_root(root, BINS)
    for d in ("testbed", "usr/local/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\nuser:x:1000:\n")
    (root / "etc/hostname").write_text("image\n")
    os.chmod(root / "tmp", 0o1777)
    shift_tree(root)
    return root


def shift_tree(root: Path, uid: int = 0, gid: int = 0) -> None:
    """Own every file by the shifted ``uid``/``gid``, as the store's unpacker does."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), UID_SHIFT + uid, UID_SHIFT + gid, follow_symlinks=False)
    os.chown(root, UID_SHIFT + uid, UID_SHIFT + gid)
