"""Shell: ``CpuManager``, the CPU mechanism of one node: stateful sandboxes with
Allocate-on-Execution.

Contract for callers (the node agent, benches, tests):
  * Every public method is blocking and thread-safe. The live runtime calls them from
    asyncio through ``asyncio.to_thread``; to cancel a running ``exec``/``run_in_session``
    it sets the ``cancel`` event it passed, and the call then returns ``cancelled``.
  * The caller decides how many cores an action gets (``cores=N``); the manager only picks
    which cpus (NUMA-aware, least loaded) and applies the grant for exactly the action's
    duration. No queueing or admission policy lives here.
  * Sandboxes sit frozen at the minimum quota between actions: zero CPU, state kept.
  * Bad input raises ``InvalidRequestError`` naming the field; an unknown id raises
    ``SandboxNotFoundError``; a dead sandbox raises ``SandboxDeadError``. Failures of the
    program itself are never raised: they are outcomes of the returned ``ExecResult``.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from arl_tangram.managers.cpu import files
from arl_tangram.managers.cpu.actions import ActionRequest, run_action
from arl_tangram.managers.cpu.cgroup_detect import detect_driver
from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.cgroup_null import NullCgroupDriver
from arl_tangram.managers.cpu.config import (
    CpuManagerConfig,
    SandboxSpec,
    validate_command,
    validate_cores,
    validate_env,
    validate_stdin,
    validate_timeout,
)
from arl_tangram.managers.cpu.cores import CoreAllocationModel
from arl_tangram.managers.cpu.errors import (
    CgroupUnavailableError,
    InvalidRequestError,
    SandboxNotFoundError,
)
from arl_tangram.managers.cpu.launch import SANDBOX_PATH, SandboxLayout
from arl_tangram.managers.cpu.native_launcher import launcher_path
from arl_tangram.managers.cpu.reaper import Reaper, become_subreaper
from arl_tangram.managers.cpu.results import ExecResult
from arl_tangram.managers.cpu.sandbox import Sandbox, SandboxState
from arl_tangram.managers.cpu.session_runner import SessionRegistry
from arl_tangram.managers.cpu.topology import CpuTopology, read_topology

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grant:
    """Cores applied to a sandbox by ``CpuManager.grant`` until ``CpuManager.reclaim``."""

    sandbox_id: str
    cpus: tuple[int, ...]
    cores: int


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    state: str
    init_pid: int
    granted_cores: int
    mem_bytes: int
    spec: SandboxSpec


class CpuManager:
    """Sandboxes on this node. Use as a context manager, or call ``close``."""

    def __init__(self, config: CpuManagerConfig | None = None, *, topology: CpuTopology | None = None) -> None:
        self.config = config or CpuManagerConfig()
        _check_host(self.config)
        self.root_name = f"arl-tangram-{os.getpid()}-{secrets.token_hex(3)}"
        self.driver: CgroupDriver = self._make_driver()
        self.topology = topology or read_topology()
        self._cores = CoreAllocationModel(self.topology)
        self._lock = threading.Lock()
        self._sandboxes: dict[str, Sandbox] = {}
        self._specs: dict[str, SandboxSpec] = {}
        self._pool: deque[Sandbox] = deque()
        self._pool_cv = threading.Condition(self._lock)
        self._closed = False
        become_subreaper()
        launcher_path()  # build the native launcher now, not inside the first action
        self.driver.create_root()
        self._reaper = Reaper()
        self._reaper.start()
        self.sessions = SessionRegistry(self)
        self._filler: threading.Thread | None = None
        if self.config.pool_size:
            for _ in range(self.config.pool_size):
                self._pool.append(self._start_sandbox(self.config.default_spec))
            self._filler = threading.Thread(target=self._fill_pool, name="arl-tangram-cpu-pool", daemon=True)
            self._filler.start()

    def _make_driver(self) -> CgroupDriver:
        if self.config.unisolated:
            log.warning(
                "!!! arl-tangram CPU manager in UNISOLATED development mode: sandboxes have NO cpu, "
                "memory or pids limits, NO accounting and NO freezing. Never use this for training. !!!"
            )
            return NullCgroupDriver(self.root_name)
        return detect_driver(self.root_name, cgroup_parent=self.config.cgroup_parent)

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> CpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy every sandbox (pool included), remove the cgroups, stop the reaper.
        Idempotent; concurrent calls on a closed manager raise ``SandboxNotFoundError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pool_cv.notify_all()
        if self._filler is not None:
            self._filler.join()
        with self._lock:
            doomed = list(self._sandboxes.values()) + list(self._pool)
            self._sandboxes.clear()
            self._pool.clear()
        for sb in doomed:
            with sb.lock:
                sb.destroy()
        self.driver.remove_root()
        self._reaper.close()

    def _layout(self, spec: SandboxSpec) -> SandboxLayout:
        c = self.config
        return SandboxLayout(
            ro_binds=c.ro_binds, workspace_bytes=spec.workspace_bytes, tmp_bytes=spec.tmp_bytes,
            sandbox_uid=c.sandbox_uid, sandbox_gid=c.sandbox_uid, host_uid=c.host_uid, host_gid=c.host_gid,
        )  # fmt: skip

    def _start_sandbox(self, spec: SandboxSpec) -> Sandbox:
        sb = Sandbox(secrets.token_hex(6), self.driver, self._layout(spec), self.topology.cpus)
        try:
            sb.start(spec.mem_bytes, spec.pids_max)
        except BaseException:
            sb.destroy()
            raise
        return sb

    def _fill_pool(self) -> None:
        """Keep ``pool_size`` warm sandboxes; wakes when one is taken. Stops at ``close``."""
        while True:
            with self._lock:
                while not self._closed and len(self._pool) >= self.config.pool_size:
                    self._pool_cv.wait()
                if self._closed:
                    return
            try:
                sb = self._start_sandbox(self.config.default_spec)
            except Exception:
                log.exception("warm pool: sandbox start failed")
                continue
            with self._lock:
                if self._closed:
                    doomed: Sandbox | None = sb
                else:
                    self._pool.append(sb)
                    doomed = None
            if doomed is not None:
                doomed.destroy()

    def create_sandbox(self, spec: SandboxSpec | None = None) -> str:
        """A new frozen sandbox; taken from the warm pool when its filesystem sizes match."""
        spec = spec or self.config.default_spec
        if not isinstance(spec, SandboxSpec):
            raise InvalidRequestError("spec", "must be a SandboxSpec", spec)
        d = self.config.default_spec
        sb: Sandbox | None = None
        with self._lock:
            self._check_open()
            if self._pool and (spec.workspace_bytes, spec.tmp_bytes) == (d.workspace_bytes, d.tmp_bytes):
                sb = self._pool.popleft()
                self._pool_cv.notify_all()
        if sb is not None:
            self.driver.set_limits(sb.group, spec.mem_bytes, spec.pids_max)
        else:
            sb = self._start_sandbox(spec)
        with self._lock:
            self._sandboxes[sb.sandbox_id] = sb
            self._specs[sb.sandbox_id] = spec
        return sb.sandbox_id

    def destroy_sandbox(self, sandbox_id: str) -> None:
        """Kill everything in the sandbox and remove it; its sessions end too."""
        with self._lock:
            sb = self._sandboxes.pop(sandbox_id, None)
            self._specs.pop(sandbox_id, None)
        if sb is None:
            raise SandboxNotFoundError(f"sandbox_id: no live sandbox {sandbox_id!r}")
        self.sessions.forget_sandbox(sandbox_id)
        with sb.lock:
            sb.destroy()

    def list_sandboxes(self) -> list[str]:
        with self._lock:
            return sorted(self._sandboxes)

    def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        sb = self.get_sandbox(sandbox_id)
        with sb.lock:
            sb.alive()
            return SandboxInfo(sb.sandbox_id, str(sb.state), sb.init_pid, sb.granted_cores,
                               self.driver.sandbox_memory_bytes(sb.group), self._specs[sandbox_id])  # fmt: skip

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        with self._lock:
            sb = self._sandboxes.get(sandbox_id) if isinstance(sandbox_id, str) else None
        if sb is None:
            raise SandboxNotFoundError(f"sandbox_id: no live sandbox {sandbox_id!r}")
        return sb

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxNotFoundError("the CPU manager is closed")

    # -- Allocate-on-Execution ----------------------------------------------------------
    def grant(self, sandbox_id: str, cores: int) -> Grant:
        """Give the sandbox ``cores`` cores now (thaw, quota, cpuset). Pair with ``reclaim``."""
        cores = validate_cores(cores, len(self.topology.cpus))
        sb = self.get_sandbox(sandbox_id)
        with self._lock:
            cpus = self._cores.acquire(cores)
        try:
            with sb.lock:
                sb.grant(cpus, cores)
        except BaseException:
            with self._lock:
                self._cores.release(cpus)
            raise
        return Grant(sandbox_id, cpus, cores)

    def reclaim(self, grant: Grant) -> None:
        """Take a grant back; the last one refreezes the sandbox at zero CPU. Idempotent for
        a destroyed sandbox."""
        with self._lock:
            sb = self._sandboxes.get(grant.sandbox_id)
            self._cores.release(grant.cpus)
        if sb is not None:
            with sb.lock:
                if sb.alive():
                    sb.reclaim(grant.cpus, grant.cores)

    def core_load(self) -> dict[int, int]:
        """cpu -> number of live grants on it."""
        with self._lock:
            return self._cores.load()

    def base_env(self, sandbox_id: str, cores: int) -> dict[str, str]:
        return {
            "PATH": SANDBOX_PATH, "HOME": "/workspace", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "USER": "sandbox", "TANGRAM_SANDBOX_ID": sandbox_id, "TANGRAM_DOP": str(cores),
        }  # fmt: skip

    # -- actions --------------------------------------------------------------------------
    def exec(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        cores: int = 1,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float = 60.0,
        max_output_bytes: int | None = None,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run a program (argv) or a ``bash -c`` string in the sandbox with ``cores`` cores
        granted for its duration. ``TANGRAM_DOP`` is set to ``cores`` and the cpuset makes
        ``nproc`` report it. ``env`` extends the sandbox's base environment."""
        argv = validate_command(command)
        cores = validate_cores(cores, len(self.topology.cpus))
        req = ActionRequest(
            argv=argv, env={**validate_env(env), "TANGRAM_DOP": str(cores)}, cwd=self._cwd(cwd),
            stdin=validate_stdin(stdin), timeout_s=validate_timeout(timeout_s),
            max_output_bytes=self._cap(max_output_bytes),
        )  # fmt: skip
        sb = self.get_sandbox(sandbox_id)
        req = replace(req, env={**self.base_env(sandbox_id, cores), **req.env})
        grant = self.grant(sandbox_id, cores)
        try:
            with sb.lock:
                slot = sb.acquire_slot()
            try:
                return run_action(sb, self.driver, slot, req, (grant.cpus, grant.cores), cancel)
            finally:
                with sb.lock:
                    sb.release_slot(slot)
        finally:
            self.reclaim(grant)

    def _cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return "/workspace"
        parts = files.sandbox_path(cwd, self._layout(self.config.default_spec), field="cwd")
        return "/" + "/".join(parts)

    def _cap(self, max_output_bytes: int | None) -> int:
        if max_output_bytes is None:
            return self.config.max_output_bytes
        if not isinstance(max_output_bytes, int) or isinstance(max_output_bytes, bool) or max_output_bytes < 0:
            raise InvalidRequestError("max_output_bytes", "must be an integer >= 0", max_output_bytes)
        return max_output_bytes

    # -- files ----------------------------------------------------------------------------
    def write_file(self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create or replace a file (parents created) in the workspace or /tmp. No grant
        needed: works while the sandbox is frozen."""
        sb = self.get_sandbox(sandbox_id)
        sb.ensure_alive()
        blob = data.encode() if isinstance(data, str) else bytes(data)
        files.write_file(sb.root_dir, sb.layout, path, blob, mode)

    def read_file(self, sandbox_id: str, path: str, max_bytes: int | None = None) -> bytes:
        sb = self.get_sandbox(sandbox_id)
        sb.ensure_alive()
        return files.read_file(sb.root_dir, sb.layout, path, max_bytes)

    def upload(self, sandbox_id: str, host_path: str, path: str) -> int:
        """Copy a host file or directory tree into the sandbox; returns the files copied."""
        if os.path.isdir(host_path):
            count = 0
            for dirpath, _, names in os.walk(host_path):
                for name in sorted(names):
                    src = os.path.join(dirpath, name)
                    rel = os.path.relpath(src, host_path)
                    if os.path.isfile(src) and not os.path.islink(src):
                        with open(src, "rb") as f:
                            self.write_file(sandbox_id, f"{path.rstrip('/')}/{rel}", f.read(), os.stat(src).st_mode & 0o777)
                        count += 1
            return count
        if not os.path.isfile(host_path):
            raise InvalidRequestError("host_path", "must be an existing file or directory", host_path)
        with open(host_path, "rb") as f:
            self.write_file(sandbox_id, path, f.read(), os.stat(host_path).st_mode & 0o777)
        return 1

    def download(self, sandbox_id: str, path: str, host_path: str) -> int:
        """Copy a sandbox file or directory tree to ``host_path``; returns the files copied."""
        sb = self.get_sandbox(sandbox_id)
        sb.ensure_alive()
        try:
            data = files.read_file(sb.root_dir, sb.layout, path)
        except InvalidRequestError:
            data = None  # a directory
        if data is not None:
            with open(host_path, "wb") as f:
                f.write(data)
            return 1
        count = 0
        os.makedirs(host_path, exist_ok=True)
        for rel, is_dir in files.list_tree(sb.root_dir, sb.layout, path):
            target = os.path.join(host_path, rel)
            if is_dir:
                os.makedirs(target, exist_ok=True)
                continue
            with open(target, "wb") as f:
                f.write(files.read_file(sb.root_dir, sb.layout, f"{path.rstrip('/')}/{rel}"))
            count += 1
        return count

    # -- sessions (see session_runner) ----------------------------------------------------
    def open_session(self, sandbox_id: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        """Start a persistent bash in the sandbox; returns its session id."""
        return self.sessions.open(sandbox_id, validate_env(env), self._cwd(cwd))

    def run_in_session(
        self, session_id: str, command: str, *, cores: int = 1, timeout_s: float = 60.0,
        max_output_bytes: int | None = None, cancel: threading.Event | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run a command in the session's shell (state persists). A timeout kills the
        command's processes (the session's background jobs too) and keeps the shell."""
        if not isinstance(command, str) or "\0" in command:
            raise InvalidRequestError("command", "must be a string without NUL bytes", command)
        return self.sessions.run(session_id, command, validate_cores(cores, len(self.topology.cpus)), validate_timeout(timeout_s), self._cap(max_output_bytes), cancel)

    def close_session(self, session_id: str) -> None:
        self.sessions.close(session_id)


def _check_host(config: CpuManagerConfig) -> None:
    for tool in ("bwrap", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            raise CgroupUnavailableError(f"the CPU manager needs '{tool}' on PATH (Debian: apt-get install bubblewrap util-linux)")
    if os.geteuid() != 0 and not config.unisolated:
        raise CgroupUnavailableError(
            "the CPU manager must run as root to write cgroups and enter sandboxes; "
            "pass unisolated=True for an explicitly unisolated development mode"
        )


__all__ = ["CpuManager", "Grant", "SandboxInfo", "SandboxState"]
