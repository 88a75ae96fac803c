"""Test images made from the host's own files: a tiny root filesystem (bash, coreutils bits,
procps, python3 with a trimmed stdlib) chown-shifted by ``UID_SHIFT`` as the image store
would unpack it. Built in a few hundred milliseconds, no network."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from arl_tangram.core.env_spec import UID_SHIFT

BINS = (
    "bash", "sh", "cat", "ls", "echo", "id", "env", "sleep", "true", "false", "mkdir", "rm", "cp",
    "mv", "touch", "head", "tail", "df", "seq", "wc", "tr", "grep", "pgrep", "ps", "kill", "nohup",
    "setsid", "timeout", "truncate", "mkfifo", "pwd", "stat", "python3", "readlink", "ln", "chmod",
    "sed", "dd", "whoami", "uname", "nproc",
)
_PY_SKIP = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "turtledemo", "__pycache__", "config-3.11-x86_64-linux-gnu"}


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    return {w for line in out.splitlines() for w in line.split() if w.startswith("/")}


def _copy(src: str, root: Path, dst_path: str) -> None:
    dst = root / dst_path.lstrip("/")
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(os.path.realpath(src), dst)


def build_base(root: Path) -> Path:
    """A merged-/usr base image at ``root`` (which must not exist yet); returns it."""
    (root / "usr/bin").mkdir(parents=True)
    libs: set[str] = set()
    for name in BINS:
        path = "/usr/bin/python3" if name == "python3" else shutil.which(name)
        assert path is not None, name
        shutil.copy2(os.path.realpath(path), root / "usr/bin" / name)
        libs |= _libs(path)
    for lib in sorted(libs):
        _copy(lib, root, lib if lib.startswith("/usr/") else "/usr" + lib)  # merged /usr, like the host
    shutil.copytree("/usr/lib/python3.11", root / "usr/lib/python3.11", symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _PY_SKIP])  # fmt: skip
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
        os.symlink(target, root / link)
    for d in ("etc", "root", "tmp", "testbed", "usr/local/bin"):
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
