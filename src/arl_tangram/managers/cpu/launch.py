"""Shell: argv builders for the two kinds of processes the manager starts.

Both go through one launcher: ``/bin/sh`` writes its own pid into every cgroup file of the
target slot and only then execs the real program, so the process (and all it forks) is
inside the sandbox's limits before any untrusted code runs. ``nsenter`` alone would escape
them. The launcher is spawned with ``vfork`` semantics (no ``preexec_fn``), which keeps
``exec`` cheap even when the manager's own process is large.

Host-side programs (sh, setpriv, nsenter) run with a fixed clean environment; the action's
environment is applied only inside the sandbox by ``env -i``, so variables such as
``LD_PRELOAD`` never reach a program running as host root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu.rootfs import ImageRoot

#: exit status of the launcher when joining the cgroups failed (never a program's own status
#: on its own: the launcher also writes ``LAUNCH_MARK`` to stderr)
LAUNCH_FAILED_RC = 125
LAUNCH_MARK = b"arl-tangram-launch:"
#: exit status of the native launcher when its own timer killed the program; it also writes
#: ``LAUNCH_TIMEOUT_MARK`` to stderr
LAUNCH_TIMEOUT_RC = 124
LAUNCH_TIMEOUT_MARK = b"\narl-tangram-launch: timeout\n"
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
NOTICE_FD_ENV = "ARL_TANGRAM_NOTICE_FD"  # the native launcher's started notice (``actions.started_notice``)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def join_then_exec(join_files: Sequence[str], argv: Sequence[str]) -> list[str]:
    """argv that joins ``join_files`` (cgroup.procs files), then execs ``argv``."""
    lines = [
        f'echo $$ > "${i + 1}" || {{ echo "{LAUNCH_MARK.decode()} cannot join cgroup ${i + 1}" >&2; exit {LAUNCH_FAILED_RC}; }}'
        for i in range(len(join_files))
    ]
    script = "\n".join([*lines, f"shift {len(join_files)}", 'exec "$@"'])
    return ["/bin/sh", "-c", script, "arl-tangram-launch", *join_files, *argv]


@dataclass(frozen=True)
class SandboxLayout:
    """What the sandbox's filesystem looks like; built once per manager config."""

    ro_binds: tuple[str, ...]  # host paths bound read-only at the same place
    workspace: str = "/workspace"
    workspace_bytes: int = 512 << 20
    tmp_bytes: int = 256 << 20
    sandbox_uid: int = 1000
    sandbox_gid: int = 1000
    host_uid: int = 65534  # the unprivileged host uid the sandbox's user maps to
    host_gid: int = 65534
    hostname: str = "sandbox"
    dev_bytes: int = 16 << 20
    root: ImageRoot | None = None  # None: the host root (ro_binds); else an image's overlay

    @property
    def default_cwd(self) -> str:
        """Where actions start and relative file paths resolve: the image's WorkingDir on an
        image root, else the workspace."""
        return self.root.working_dir if self.root is not None else self.workspace


def bwrap_argv(layout: SandboxLayout, info_fd: int, init_argv: Sequence[str], data_binds: Sequence[tuple[int, str]] = ()) -> list[str]:
    """setpriv + bubblewrap argv for a sandbox init; bwrap then runs as the unprivileged host
    user, so the sandbox's uid maps to that user, never to host root. Each ``(fd, path)`` of
    ``data_binds`` is a readable fd whose contents bwrap binds read-only at ``path``, over the
    ro-binds (the generated ``/etc/passwd``: see ``identity``)."""
    argv = [
        "setpriv", f"--reuid={layout.host_uid}", f"--regid={layout.host_gid}", "--clear-groups",
        "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--uid", str(layout.sandbox_uid), "--gid", str(layout.sandbox_gid), "--hostname", layout.hostname,
    ]  # fmt: skip
    for path in layout.ro_binds:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for fd, path in data_binds:
        argv += ["--perms", "0644", "--ro-bind-data", str(fd), path]
    argv += [
        # /dev is read-only but for a bounded /dev/shm: a tmpfs /dev was an unbounded sink
        "--proc", "/proc", "--dev", "/dev", "--size", str(layout.dev_bytes), "--tmpfs", "/dev/shm",
        "--size", str(layout.workspace_bytes), "--tmpfs", layout.workspace,
        "--perms", "1777", "--size", str(layout.tmp_bytes), "--tmpfs", "/tmp",
        "--chdir", layout.workspace, "--remount-ro", "/", "--remount-ro", "/dev", "--new-session",
        "--info-fd", str(info_fd), "--", *init_argv,
    ]  # fmt: skip
    return argv


def nsenter_argv(init_pid: int, layout: SandboxLayout, cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """Enter every namespace of the sandbox's init as its unprivileged user, then exec ``argv``
    under exactly ``env`` in ``cwd``."""
    pairs = [f"{k}={v}" for k, v in sorted(env.items())]
    return [
        "nsenter", "-t", str(init_pid), "-U", "-m", "-p", "-n", "-i", "-u",
        "-S", str(layout.sandbox_uid), "-G", str(layout.sandbox_gid), "-W", cwd, "--",
        "/usr/bin/env", "-i", *pairs, *argv,
    ]  # fmt: skip


def native_argv(
    launcher: str, join_files: Sequence[str], init_pid: int, layout: SandboxLayout, cwd: str, env: Mapping[str, str], argv: Sequence[str],
    timeout_ms: int = 0,
) -> list[str]:  # fmt: skip
    """The same as ``join_then_exec(join_files, nsenter_argv(...))`` in one native exec; with
    ``timeout_ms`` > 0 the launcher itself kills the program's process group that long after
    it started (see ``native_launcher``)."""
    return [*native_head(launcher, join_files, init_pid, layout), *native_run(cwd, env, argv, timeout_ms)]


def native_head(launcher: str, join_files: Sequence[str], init_pid: int, layout: SandboxLayout) -> list[str]:
    """The native launcher's arguments up to the run's own: what to join and whom to become
    (all an armed launcher is started with, ``armed``)."""
    return [launcher, str(len(join_files)), *join_files, str(init_pid), str(layout.sandbox_uid), str(layout.sandbox_gid)]


def native_run(cwd: str, env: Mapping[str, str], argv: Sequence[str], timeout_ms: int = 0) -> list[str]:
    """The native launcher's arguments of one run (an armed launcher reads them later)."""
    pairs = [f"{k}={v}" for k, v in sorted(env.items())]
    return [cwd, str(max(0, timeout_ms)), str(len(pairs)), *pairs, "--", *argv]
