"""Shell: starting one sandbox's init (bubblewrap) inside its cgroups and waiting until it
can be entered. Who calls: ``Sandbox.start`` only."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time

from arl_tangram.managers.cpu.errors import CpuManagerError
from arl_tangram.managers.cpu.fd_ready import readable
from arl_tangram.managers.cpu.identity import identity_files
from arl_tangram.managers.cpu.launch import HOST_ENV, SandboxLayout, bwrap_argv, join_then_exec
from arl_tangram.managers.cpu.rootfs import helper_argv, image_bwrap_argv
from arl_tangram.managers.cpu.rootfs_native import helper_path

INIT_ARGV = ("/usr/bin/sleep", "infinity")
START_TIMEOUT_S = 10.0
READY = b"R"  # what an image sandbox's init writes once it runs (see rootfs_native)


def spawn_init(sandbox_id: str, layout: SandboxLayout, join_files: tuple[str, ...]) -> tuple[subprocess.Popen[bytes], int]:
    """Spawn the bubblewrap monitor (our child, which reaps the namespace's pid 1) and return
    it with the host pid of that pid 1, once its mounts are ready. On failure the monitor is
    killed and waited for, and ``CpuManagerError`` names the cause."""
    r, w = os.pipe2(os.O_CLOEXEC)
    w_ready = os.dup(w)  # a second writer bwrap does not know of (it closes its info fd)
    proc: subprocess.Popen[bytes] | None = None
    data_fds = _identity_fds(layout)
    try:
        argv = _init_argv(sandbox_id, layout, join_files, w, w_ready, data_fds)
        proc = subprocess.Popen(
            argv, pass_fds=(w, w_ready) if layout.root is not None else (w, *(fd for fd, _ in data_fds)), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=HOST_ENV,
        )  # fmt: skip
        os.close(w)
        os.close(w_ready)
        w = w_ready = -1
        init_pid, ready = _read_child_pid(sandbox_id, r, proc, want_ready=layout.root is not None)
        if not ready:
            _wait_ready(sandbox_id, init_pid, proc)
        return proc, init_pid
    except BaseException:
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
        raise
    finally:
        os.close(r)
        for fd, _ in data_fds:
            os.close(fd)
        for fd in (w, w_ready):
            if fd >= 0:
                os.close(fd)
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()  # only start errors matter; never block the init


def _identity_fds(layout: SandboxLayout) -> list[tuple[int, str]]:
    """For the host root: a read end per generated identity file, already holding its whole
    contents (a few hundred bytes, far below a pipe's buffer, so the write never blocks)."""
    if layout.root is not None:
        return []
    fds: list[tuple[int, str]] = []
    try:
        for path, data in identity_files(layout).items():
            r, w = os.pipe2(os.O_CLOEXEC)
            fds.append((r, path))
            try:
                os.write(w, data)
            finally:
                os.close(w)
    except BaseException:
        for fd, _ in fds:
            os.close(fd)
        raise
    return fds


def _init_argv(
    sandbox_id: str, layout: SandboxLayout, join_files: tuple[str, ...], info_fd: int, ready_fd: int,
    data_fds: list[tuple[int, str]],
) -> list[str]:  # fmt: skip
    if layout.root is None:
        return join_then_exec(join_files, bwrap_argv(layout, info_fd, INIT_ARGV, data_fds))
    helper = helper_path()
    if helper is None:
        raise CpuManagerError(f"sandbox {sandbox_id}: an image root needs the native rootfs helper, and no C compiler could build it")
    bwrap = image_bwrap_argv(
        layout.root, hostname=layout.hostname, dev_bytes=layout.dev_bytes, workspace=layout.workspace,
        workspace_bytes=layout.workspace_bytes, tmp_bytes=layout.tmp_bytes, info_fd=info_fd, ready_fd=ready_fd,
    )  # fmt: skip
    return helper_argv(helper, join_files, layout.root, bwrap)


def _read_child_pid(sandbox_id: str, fd: int, proc: subprocess.Popen[bytes], want_ready: bool) -> tuple[int, bool]:
    """(pid 1's host pid, whether the init said it runs). bwrap writes the pid as JSON; an
    image sandbox's init then appends ``READY`` to the same pipe (``want_ready``)."""
    data = b""
    pid = -1
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        chunk = os.read(fd, 4096) if readable(fd, deadline - time.monotonic()) else b""
        if not chunk:
            break
        data += chunk
        marker = READY in data  # bwrap's JSON has no capital R, so the byte can sit anywhere
        with contextlib.suppress(ValueError):
            pid = int(json.loads(data.replace(READY, b""))["child-pid"])
        if pid > 0 and (marker or not want_ready):
            return pid, marker
    if pid > 0:
        return pid, False  # the pipe closed without the marker: let _wait_ready decide
    raise CpuManagerError(f"sandbox {sandbox_id}: bubblewrap did not start: {_start_error(proc)}")


def _wait_ready(sandbox_id: str, init_pid: int, proc: subprocess.Popen[bytes]) -> None:
    """bwrap reports the pid before the mounts are done; its pid 1 forks the init command
    only after setup, so a child of pid 1 means the sandbox is ready to be entered."""
    children = f"/proc/{init_pid}/task/{init_pid}/children"
    deadline = time.monotonic() + START_TIMEOUT_S
    delay = 0.0002
    while time.monotonic() < deadline:
        try:
            with open(children, encoding="ascii") as f:
                if f.read().strip():
                    return
        except FileNotFoundError:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
    raise CpuManagerError(f"sandbox {sandbox_id}: init did not become ready: {_start_error(proc)}")


def _start_error(proc: subprocess.Popen[bytes]) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=0.5)
    text = b""
    if proc.stderr is not None and proc.poll() is not None:
        with contextlib.suppress(OSError):
            text = proc.stderr.read() or b""
    return f"exit status {proc.returncode}: {text.decode(errors='replace').strip() or 'no message'}"
