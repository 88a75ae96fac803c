"""Shell: the manager's host-side file calls (write, read, upload, download), bounded.

Who calls: ``CpuManager``'s file methods. Each call opens the sandbox root through
``Sandbox.open_root`` (pidfd-checked) and goes through ``files`` (regular files only,
non-blocking opens, atomic writes). Sizes are capped by ``CpuManagerConfig.max_file_bytes``
per file and ``max_transfer_bytes`` per upload or download, with an error naming the cap;
host-side sources are opened the same careful way (a FIFO on the host is refused too).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from arl_tangram.managers.cpu import files, wipe
from arl_tangram.managers.cpu.config import CpuManagerConfig
from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.sandbox import Sandbox


class Transfers:
    """File calls on sandboxes under one config's caps."""

    def __init__(self, config: CpuManagerConfig) -> None:
        self._cap = config.max_file_bytes
        self._total = config.max_transfer_bytes

    def write(self, sb: Sandbox, path: str, data: bytes, mode: int) -> None:
        if len(data) > self._cap:
            raise InvalidRequestError("data", f"must be at most {self._cap} bytes (config.max_file_bytes)", len(data))
        root = sb.open_root()
        try:
            files.write_file(root, sb.layout, path, data, mode)
        finally:
            os.close(root)

    def read(self, sb: Sandbox, path: str, max_bytes: int | None = None) -> bytes:
        root = sb.open_root()
        try:
            return files.read_file(root, sb.layout, path, self._cap, max_bytes)
        finally:
            os.close(root)

    def empty_dirs(self, sb: Sandbox, paths: Sequence[str]) -> tuple[bool, str]:
        root = sb.open_root()
        try:
            return wipe.empty_dirs(root, sb.layout, paths)
        finally:
            os.close(root)

    def require_dir(self, sb: Sandbox, path: str, field: str) -> None:
        root = sb.open_root()
        try:
            files.require_dir(root, sb.layout, path, field)
        finally:
            os.close(root)

    def _host_file(self, host_path: str, budget: int) -> tuple[bytes, int]:
        fd = os.open(host_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidRequestError("host_path", "must name regular files (no FIFO, device or link)", host_path)
            cap = min(self._cap, budget)
            if st.st_size > cap:
                raise InvalidRequestError("host_path", f"file is {st.st_size} bytes, over the cap of {cap} (config.max_file_bytes / max_transfer_bytes)", host_path)
            data = f.read(cap + 1)
            if len(data) > cap:
                raise InvalidRequestError("host_path", f"file grew over the cap of {cap} bytes while read", host_path)
            return data, st.st_mode & 0o777

    def upload(self, sb: Sandbox, host_path: str, path: str) -> int:
        """Copy a host file or directory tree (regular files only) into the sandbox."""
        if not os.path.isdir(host_path) or os.path.islink(host_path):
            data, mode = self._host_file(host_path, self._total)
            self.write(sb, path, data, mode)
            return 1
        count, used = 0, 0
        for dirpath, dirnames, names in os.walk(host_path):
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
            for name in sorted(names):
                src = os.path.join(dirpath, name)
                if os.path.islink(src) or not os.path.isfile(src):
                    continue
                data, mode = self._host_file(src, self._total - used)
                used += len(data)
                self.write(sb, f"{path.rstrip('/')}/{os.path.relpath(src, host_path)}", data, mode)
                count += 1
        return count

    def download(self, sb: Sandbox, path: str, host_path: str) -> int:
        """Copy a sandbox file or directory tree (regular files only) to ``host_path``."""
        root = sb.open_root()
        try:
            if files.is_regular(root, sb.layout, path):
                _write_host(host_path, files.read_file(root, sb.layout, path, min(self._cap, self._total)))
                return 1
            count, used = 0, 0
            os.makedirs(host_path, exist_ok=True)
            for rel, is_dir in files.list_tree(root, sb.layout, path):
                target = os.path.join(host_path, rel)
                if is_dir:
                    os.makedirs(target, exist_ok=True)
                    continue
                data = files.read_file(root, sb.layout, f"{path.rstrip('/')}/{rel}", min(self._cap, self._total - used))
                used += len(data)
                _write_host(target, data)
                count += 1
            return count
        finally:
            os.close(root)


def _write_host(host_path: str, data: bytes) -> None:
    fd = os.open(host_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
