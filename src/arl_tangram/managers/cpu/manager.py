"""Shell: ``CpuManager``, the CPU mechanism of one node: stateful sandboxes with
Allocate-on-Execution, addressed by the controller's ids.

Contract for callers (the node agent, benches, tests):
  * Every public method is blocking and thread-safe; the controller calls them from a
    bounded thread pool. No I/O, fork or sleep happens under the manager-wide lock (reserve
    under it, work outside, publish under it); per-sandbox work takes ``Sandbox.lock``.
  * The caller names every grant (``millicores``, ``numa_millicores``, ``dop``; see
    ``grants``); the manager only picks which cpus inside a domain. No queueing or admission
    policy lives here. ``hold`` gives a sandbox a standing holding (Kubernetes requests).
  * Sandboxes without a holding sit frozen at the minimum quota between actions.
  * Bad input raises ``InvalidRequestError`` naming the field and the rule; an unknown id
    raises ``SandboxNotFoundError``; a dead sandbox raises ``SandboxDeadError``. Failures of
    the program, and destroy/close racing a call, are never raised: they are outcomes of the
    returned ``ExecResult`` (``cancelled``, or ``error`` naming the cause).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from arl_tangram.managers.cpu import files
from arl_tangram.managers.cpu.actions import ActionRequest, run_action
from arl_tangram.managers.cpu.armed import Armory
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
)  # fmt: skip
from arl_tangram.managers.cpu.cores import CoreAllocationModel
from arl_tangram.managers.cpu.errors import (
    CgroupUnavailableError,
    CpuManagerError,
    InvalidRequestError,
    SandboxNotFoundError,
)
from arl_tangram.managers.cpu.grants import MILLICORES_PER_CORE, GrantRequest, grant_request
from arl_tangram.managers.cpu.keeper import Keeper, sweep_dead
from arl_tangram.managers.cpu.launch import SANDBOX_PATH, SandboxLayout
from arl_tangram.managers.cpu.memory_pause import MemoryPauses
from arl_tangram.managers.cpu.native_launcher import launcher_path
from arl_tangram.managers.cpu.preempt import RunHandle
from arl_tangram.managers.cpu.proc_io import OutputSink
from arl_tangram.managers.cpu.results import ExecResult, Outcome
from arl_tangram.managers.cpu.rootfs_native import helper_path
from arl_tangram.managers.cpu.sandbox import Holding, Sandbox, SandboxGoneError, SandboxState
from arl_tangram.managers.cpu.session_runner import SessionRegistry
from arl_tangram.managers.cpu.spool import Spool
from arl_tangram.managers.cpu.topology import CpuTopology, read_topology
from arl_tangram.managers.cpu.transfer import Transfers

log = logging.getLogger(__name__)
_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


class ManagerClosedError(SandboxNotFoundError):
    """The manager is closed (or closed while the call ran): nothing was created."""


@dataclass(frozen=True)
class Grant:
    """A sandbox-wide grant from ``CpuManager.grant`` (thawed, quota raised) until ``reclaim``."""

    sandbox_id: str
    cpus: tuple[int, ...]
    cores: int
    token: int = 0


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    state: str
    init_pid: int
    granted_cores: int
    mem_bytes: int
    spec: SandboxSpec
    granted_millicores: int = 0
    holding: Holding | None = None


class CpuManager:
    """Sandboxes on this node. Use as a context manager, or call ``close``."""

    def __init__(self, config: CpuManagerConfig | None = None, *, topology: CpuTopology | None = None) -> None:
        self.config = config or CpuManagerConfig()
        _check_host(self.config)
        self.root_name = f"arl-tangram-{os.getpid()}-{secrets.token_hex(3)}"
        self.driver: CgroupDriver = self._make_driver(self.root_name)
        self.topology = topology or read_topology()
        self._cores = CoreAllocationModel(self.topology)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)  # pool changes and creates finishing
        self._sandboxes: dict[str, Sandbox] = {}
        self._specs: dict[str, SandboxSpec] = {}
        self._pending: set[str] = set()  # ids being created (reserved, not yet published)
        self._pool: deque[Sandbox] = deque()
        self._broken: list[Sandbox] = []  # destroys that left something; close retries them
        self._closed = False
        self.transfers = Transfers(self.config)
        # build the native launcher now, not inside the first action; free slots get one armed
        launcher = launcher_path()
        self.armory = Armory(launcher if self.config.arm_launchers else None)
        helper_path()  # and the image root helper, not inside the first image create
        self._keeper: Keeper | None = None
        if self.driver.version:
            self._keeper = Keeper(self.root_name, self.config.cgroup_parent)
            self._keeper.start()
            self.swept_roots = sweep_dead(self.driver, self._make_driver)
        self.driver.create_root()
        self.sessions = SessionRegistry(self)
        self.memory = MemoryPauses(self.driver)
        self._filler: threading.Thread | None = None
        if self.config.pool_size:
            for _ in range(self.config.pool_size):
                self._pool.append(self._start_sandbox(self.config.default_spec))
            self._filler = threading.Thread(target=self._fill_pool, name="arl-tangram-cpu-pool", daemon=True)
            self._filler.start()

    def _make_driver(self, root_name: str) -> CgroupDriver:
        if self.config.unisolated:
            log.warning(
                "!!! arl-tangram CPU manager in UNISOLATED development mode: sandboxes have NO cpu, "
                "memory or pids limits, NO accounting and NO freezing. Never use this for training. !!!"
            )
            return NullCgroupDriver(root_name)
        return detect_driver(root_name, cgroup_parent=self.config.cgroup_parent)

    def numa_cores(self) -> tuple[int, ...]:
        """Usable cores per NUMA domain ``d`` (``topology.domains[d]`` lists their cpus)."""
        return self.topology.numa_cores()

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> CpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy every sandbox (pool and failed destroys included), remove the cgroups, stop
        the keeper. Idempotent. Waits for creates in flight (they see the close and undo
        themselves); goes on past individual failures and raises ``CpuManagerError`` listing
        them at the end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._pending, timeout=60.0)
        if self._filler is not None:
            self._filler.join()
        with self._lock:
            doomed = list(self._sandboxes.values()) + list(self._pool)
            broken, self._broken = self._broken, []
            self._sandboxes.clear()
            self._pool.clear()
        problems: list[str] = []
        for sb in doomed:
            self.sessions.forget_sandbox(sb.sandbox_id)
            problems += [f"{sb.sandbox_id}: {p}" for p in _safe(sb.destroy)]
        problems += [f"{sb.sandbox_id}: {p}" for sb in broken for p in _safe(sb.retry_cleanup)]
        self.armory.close()  # after the destroys: their kills ended the launchers they dropped
        problems += [f"root: {p}" for p in _safe(self._remove_root)]
        if self._keeper is not None:
            self._keeper.close()
        if problems:
            raise CpuManagerError("CPU manager closed with leftovers: " + "; ".join(problems))

    def _remove_root(self) -> list[str]:
        self.driver.remove_root()
        return []

    def _layout(self, spec: SandboxSpec) -> SandboxLayout:
        c = self.config
        r = spec.root
        if r is not None:  # the image's user, over the shifted range (see rootfs)
            return SandboxLayout(
                ro_binds=(), workspace_bytes=spec.workspace_bytes, tmp_bytes=spec.tmp_bytes, sandbox_uid=r.uid,
                sandbox_gid=r.gid, host_uid=r.host_uid, host_gid=r.host_gid, dev_bytes=c.dev_bytes, root=r,
            )  # fmt: skip
        return SandboxLayout(
            ro_binds=c.ro_binds, workspace_bytes=spec.workspace_bytes, tmp_bytes=spec.tmp_bytes,
            sandbox_uid=c.sandbox_uid, sandbox_gid=c.sandbox_uid, host_uid=c.host_uid, host_gid=c.host_gid,
            dev_bytes=c.dev_bytes,
        )  # fmt: skip

    def _start_sandbox(self, spec: SandboxSpec, sandbox_id: str | None = None) -> Sandbox:
        sb = Sandbox(sandbox_id or secrets.token_hex(6), self.driver, self._layout(spec), self.topology.cpus)
        sb.before_destroy = self.armory.drop
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
                self._cv.wait_for(lambda: self._closed or len(self._pool) < self.config.pool_size)
                if self._closed:
                    return
            try:
                sb = self._start_sandbox(self.config.default_spec)
            except Exception:
                log.exception("warm pool: sandbox start failed")
                continue
            with self._lock:
                doomed = sb if self._closed else None
                if doomed is None:
                    self._pool.append(sb)
            if doomed is not None:
                doomed.destroy()

    def create_sandbox(self, spec: SandboxSpec | None = None, *, sandbox_id: str | None = None) -> str:
        """A new frozen sandbox under ``sandbox_id`` (the controller's env id: 1-64 chars of
        [A-Za-z0-9._-], not live) or a generated id; taken from the warm pool when its
        filesystem sizes match (never for an image root: ``spec.root``, see ``rootfs``). A close racing the create undoes it and raises
        ``ManagerClosedError``."""
        spec = spec or self.config.default_spec
        if not isinstance(spec, SandboxSpec):
            raise InvalidRequestError("spec", "must be a SandboxSpec", spec)
        if sandbox_id is not None and (not isinstance(sandbox_id, str) or not _ID_RE.fullmatch(sandbox_id)):
            raise InvalidRequestError("sandbox_id", "must be 1-64 characters of [A-Za-z0-9._-]", sandbox_id)
        d = self.config.default_spec
        sb: Sandbox | None = None
        with self._lock:
            if self._closed:
                raise ManagerClosedError("the CPU manager is closed")
            if sandbox_id is None:
                sandbox_id = secrets.token_hex(6)
            if sandbox_id in self._sandboxes or sandbox_id in self._pending:
                raise InvalidRequestError("sandbox_id", "must not name a live sandbox", sandbox_id)
            self._pending.add(sandbox_id)
            if self._pool and spec.root is None and (spec.workspace_bytes, spec.tmp_bytes) == (d.workspace_bytes, d.tmp_bytes):
                sb = self._pool.popleft()
                self._cv.notify_all()
        try:
            if sb is not None:
                sb.sandbox_id = sandbox_id
                self.driver.set_limits(sb.group, spec.mem_bytes, spec.pids_max)
            else:
                sb = self._start_sandbox(spec, sandbox_id)
        except BaseException:
            if sb is not None:
                sb.destroy()
            with self._lock:
                self._pending.discard(sandbox_id)
                self._cv.notify_all()
            raise
        with self._lock:
            self._pending.discard(sandbox_id)
            self._cv.notify_all()
            closed = self._closed
            if not closed:
                self._sandboxes[sandbox_id] = sb
                self._specs[sandbox_id] = spec
        if closed:
            sb.destroy()
            raise ManagerClosedError(f"sandbox_id: the CPU manager closed while {sandbox_id!r} was created")
        return sandbox_id

    def destroy_sandbox(self, sandbox_id: str) -> None:
        """Kill everything in the sandbox and remove it; its sessions and running actions end
        ``cancelled``. The id stays taken until the cgroups are gone; a cleanup that leaves
        something raises ``CpuManagerError`` naming it (``close`` retries it)."""
        sb = self.get_sandbox(sandbox_id)
        self.sessions.forget_sandbox(sandbox_id)
        problems = sb.destroy()
        holding = sb.holding
        with self._lock:
            if self._sandboxes.get(sandbox_id) is sb:
                del self._sandboxes[sandbox_id]
                self._specs.pop(sandbox_id, None)
                if holding is not None and holding.limit:
                    self._cores.release(holding.cpus)
                if problems:
                    self._broken.append(sb)
        if problems:
            raise CpuManagerError(f"sandbox {sandbox_id}: destroy left " + "; ".join(problems))

    def list_sandboxes(self) -> list[str]:
        with self._lock:
            return sorted(self._sandboxes)

    def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        sb = self.get_sandbox(sandbox_id)
        sb.alive()
        mc = sb.granted_millicores
        return SandboxInfo(sb.sandbox_id, str(sb.state), sb.init_pid, -(-mc // MILLICORES_PER_CORE),
                           self.driver.sandbox_memory_bytes(sb.group), self._specs.get(sandbox_id, self.config.default_spec),
                           mc, sb.holding)  # fmt: skip

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        with self._lock:
            sb = self._sandboxes.get(sandbox_id) if isinstance(sandbox_id, str) else None
        if sb is None:
            raise SandboxNotFoundError(f"sandbox_id: no live sandbox {sandbox_id!r}")
        return sb

    # -- grants and holdings ------------------------------------------------------------------
    def reserve(self, g: GrantRequest) -> tuple[int, ...]:
        """Count the cpus backing ``g`` used (picked here; the caller releases them)."""
        with self._lock:
            if g.num_cpus == 0:
                return ()
            if g.per_domain_cpus is not None:
                return self._cores.acquire_split(g.per_domain_cpus)
            return self._cores.acquire(g.num_cpus)

    def release(self, cpus: tuple[int, ...]) -> None:
        if cpus:
            with self._lock:
                self._cores.release(cpus)

    def hold(self, sandbox_id: str, millicores: int, numa_millicores: Sequence[int] | None = None, *, limit: bool = True) -> None:
        """Give the sandbox a standing holding for its life (replacing any previous one).
        ``limit=True`` (Guaranteed): quota = ``millicores`` on cpus reserved per domain as
        named, never frozen while idle. ``limit=False`` (Burstable): cpu shares weighted by
        ``millicores``, no quota, all cpus. Actions may then be granted 0 (run within the
        holding) or extra millicores on top."""
        g = grant_request(self.topology, millicores=millicores, numa_millicores=numa_millicores)
        if g.millicores < 1:
            raise InvalidRequestError("millicores", "a holding must be >= 1 millicore", millicores)
        sb = self.get_sandbox(sandbox_id)
        cpus = self.reserve(g) if limit else self.topology.cpus
        try:
            if not limit:
                self.driver.set_shares(sb.group, g.millicores * 1024 // MILLICORES_PER_CORE)
            old = sb.set_holding(Holding(g.millicores, cpus, bool(limit)))
        except BaseException:
            if limit:
                self.release(cpus)
            raise
        if old is not None and old.limit:
            self.release(old.cpus)

    def release_hold(self, sandbox_id: str) -> None:
        """End the sandbox's holding (it freezes again when nothing runs); idempotent."""
        sb = self.get_sandbox(sandbox_id)
        old = sb.set_holding(None)
        if old is not None:
            if old.limit:
                self.release(old.cpus)
            else:
                self.driver.set_shares(sb.group, 1024)

    def grant(self, sandbox_id: str, cores: int) -> Grant:
        """Give the whole sandbox ``cores`` more cores now (thaw, quota). Pair with ``reclaim``."""
        cores = validate_cores(cores, len(self.topology.cpus))
        sb = self.get_sandbox(sandbox_id)
        cpus = self.reserve(grant_request(self.topology, cores=cores))
        try:
            token = sb.add_grant(cores * MILLICORES_PER_CORE)
        except BaseException:
            self.release(cpus)
            raise
        return Grant(sandbox_id, cpus, cores, token)

    def reclaim(self, grant: Grant) -> None:
        """Take a grant back; the last one refreezes the sandbox. Idempotent once destroyed."""
        with self._lock:
            sb = self._sandboxes.get(grant.sandbox_id)
        self.release(grant.cpus)
        if sb is not None:
            sb.remove_grant(grant.token)

    def core_load(self) -> dict[int, int]:
        """cpu -> number of live grants and holdings on it."""
        with self._lock:
            return self._cores.load()

    def base_env(self, sandbox_id: str, dop: int) -> dict[str, str]:
        """The environment every run starts from; on an image root the image's ``Env``
        overrides the defaults (the caller's ``env`` overrides both)."""
        with self._lock:
            sb = self._sandboxes.get(sandbox_id)
        root = sb.layout.root if sb is not None else None
        base = {
            "PATH": SANDBOX_PATH, "HOME": "/workspace", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "USER": "sandbox", "TANGRAM_SANDBOX_ID": sandbox_id, "TANGRAM_DOP": str(dop),
        }  # fmt: skip
        if root is not None:
            base.update({"HOME": "/root" if root.uid == 0 else "/workspace", "USER": "root" if root.uid == 0 else str(root.uid)})
            base.update(dict(root.env))
            base["TANGRAM_SANDBOX_ID"], base["TANGRAM_DOP"] = sandbox_id, str(dop)
        return base

    # -- actions --------------------------------------------------------------------------
    def exec(
        self, sandbox_id: str, command: str | Sequence[str], *, millicores: int | None = None,
        numa_millicores: Sequence[int] | None = None, dop: int | None = None, cores: int | None = None,
        stdin: bytes | str | None = None, env: Mapping[str, str] | None = None, cwd: str | None = None,
        timeout_s: float = 60.0, max_output_bytes: int | None = None, cancel: threading.Event | None = None,
        background: bool = False, on_output: OutputSink | None = None, handle: RunHandle | None = None,
        mem_limit_bytes: int | None = None, on_memory_paused: Callable[[int], None] | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run a program (argv) or a ``bash -c`` string confined to exactly the named grant
        (see ``grants``; nothing named = 1 core). ``TANGRAM_DOP`` = ``dop``, default the
        action's cpus, which ``nproc`` reports. When the program exits, whatever it left
        running is killed unless ``background=True`` (kept, within the holding or at the
        minimum quota, until it exits or the sandbox is destroyed). ``on_output(stream,
        chunk)`` receives the output live, on the pumping thread. ``handle`` lets the
        controller demote the run while it runs (``preempt.RunHandle``).

        Memory per action: ``mem_limit_bytes`` is the env's memory limit for the run (its
        footprint + grants, at most its own limit); with ``on_memory_paused(usage_bytes)``
        it is a soft mark under the env's own hard limit: over it the run pauses (no charge,
        a tmpfs write included, fails under the env's limit) until ``grow_memory`` or
        ``oom_kill`` (``memory_pause``); without, a hard limit (OOM-killed over it). The result reports ``paused_s`` and the env's
        footprint after the run."""
        argv = validate_command(command)
        g = grant_request(self.topology, millicores=millicores, numa_millicores=numa_millicores, cores=cores, dop=dop)
        sb = self.get_sandbox(sandbox_id)
        req = ActionRequest(
            argv=argv, env=validate_env(env), cwd=self._cwd(cwd, sb.layout), stdin=validate_stdin(stdin),
            timeout_s=validate_timeout(timeout_s), max_output_bytes=self._cap(max_output_bytes), background=bool(background),
            on_output=on_output, kill_grace_s=self.config.kill_grace_s,
        )  # fmt: skip
        cpus = self.reserve(g)
        try:
            try:
                slot = sb.begin(cpus, g.millicores)
            except SandboxGoneError:
                return ExecResult(outcome=Outcome.CANCELLED, exit_code=None, millicores=g.millicores)
            pause = None
            try:
                seen = sb.slot_cpus(slot)
                dop_now = g.dop or max(1, len(seen))
                env_all = {**self.base_env(sandbox_id, dop_now), **req.env, "TANGRAM_DOP": str(dop_now)}
                if handle is not None:
                    handle.attach(sb, slot, req.timeout_s)
                if mem_limit_bytes is not None:
                    pause = self.memory.open(
                        sandbox_id, sb.group, self._mem_limit(sandbox_id, mem_limit_bytes), self._mem_limit(sandbox_id, None),
                        on_memory_paused,
                    )  # fmt: skip
                # the pump serves the memory watch (``run_watch``); the demotion handle keeps
                # its own timers: served by the pump too, its punctual retries slowed short
                # runs 2-3x under load (issue 26, README)
                watchers = (pause,) if pause is not None else ()
                run_req = ActionRequest(**{
                    **req.__dict__, "env": env_all, "paused_s": pause.paused_s if pause else None, "watchers": watchers,
                    "on_counting": handle.counting if handle is not None else None,
                    "armory": self.armory if self.armory.launcher is not None else None,  # off: not asked
                })  # fmt: skip
                res = run_action(sb, self.driver, slot, run_req, (seen, g.millicores), cancel)
            finally:
                if handle is not None:
                    handle.detach()
                sb.end(slot, keep="kept" if req.background else "free")
                if not req.background:
                    self.armory.request(sb, slot)
                paused_s = 0.0
                if pause is not None:
                    paused_s = self.memory.close(sandbox_id, pause, self._mem_limit(sandbox_id, None))
                elif mem_limit_bytes is not None:  # no watch of its own: give the env its own limit back
                    self.memory.restore(sandbox_id, sb.group, self._mem_limit(sandbox_id, None))
            if mem_limit_bytes is None:
                return res
            return replace(res, paused_s=paused_s, footprint_bytes=self.driver.sandbox_footprint_bytes(sb.group))
        finally:
            self.release(cpus)

    def _mem_limit(self, sandbox_id: str, limit_bytes: int | None) -> int:
        """``limit_bytes`` capped at the sandbox's own limit (that, when None)."""
        ceiling = self._specs.get(sandbox_id, self.config.default_spec).mem_bytes
        return ceiling if limit_bytes is None else max(1 << 20, min(limit_bytes, ceiling))

    def grow_memory(self, sandbox_id: str, limit_bytes: int) -> bool:
        """Raise the memory limit of the sandbox's running action (it resumes if paused);
        False when none of its actions runs with a memory grant (idempotent)."""
        return self.memory.grow(sandbox_id, self._mem_limit(sandbox_id, limit_bytes))

    def oom_kill(self, sandbox_id: str) -> bool:
        """End the sandbox's paused action ``oom_killed`` (the kernel's OOM killer acts)."""
        return self.memory.oom_kill(sandbox_id)

    def footprint_bytes(self, sandbox_id: str) -> int:
        """The sandbox's idle footprint now (resident + shmem, its tmpfs files included)."""
        return self.driver.sandbox_footprint_bytes(self.get_sandbox(sandbox_id).group)

    def _cwd(self, cwd: str | None, layout: SandboxLayout) -> str:
        if cwd is None:
            return layout.default_cwd
        parts = files.sandbox_path(cwd, layout, field="cwd")
        return "/" + "/".join(parts)

    def _cap(self, max_output_bytes: int | None) -> int:
        if max_output_bytes is None:
            return self.config.max_output_bytes
        if not isinstance(max_output_bytes, int) or isinstance(max_output_bytes, bool) or max_output_bytes < 0:
            raise InvalidRequestError("max_output_bytes", "must be an integer >= 0", max_output_bytes)
        return max_output_bytes

    # -- files (see transfer: bounded, regular files only, atomic, pidfd-checked) -----------
    def write_file(self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Create or atomically replace a file (parents created) in the workspace or /tmp.
        No grant needed: works while the sandbox is frozen."""
        blob = data.encode() if isinstance(data, str) else bytes(data)
        self.transfers.write(self.get_sandbox(sandbox_id), path, blob, mode)

    def read_file(self, sandbox_id: str, path: str, max_bytes: int | None = None) -> bytes:
        """A regular file's contents (a prefix of ``max_bytes``), capped by config.max_file_bytes."""
        return self.transfers.read(self.get_sandbox(sandbox_id), path, max_bytes)

    def empty_dirs(self, sandbox_id: str, paths: Sequence[str]) -> tuple[bool, str]:
        """Remove everything below each absolute directory of ``paths`` from the host side
        (``wipe``: no program runs, no grant needed); (clean, why not). For a sandbox no
        action runs in, as the SandboxFusion pool's reset between calls."""
        return self.transfers.empty_dirs(self.get_sandbox(sandbox_id), paths)

    def open_spool(self, sandbox_id: str) -> Spool:
        """A streamed upload into the sandbox, spooled in its own /tmp (see ``spool``);
        the caller closes it."""
        return Spool(self.get_sandbox(sandbox_id), self.config.max_file_bytes)

    def upload(self, sandbox_id: str, host_path: str, path: str) -> int:
        """Copy a host file or directory tree into the sandbox; returns the files copied."""
        if not os.path.exists(host_path):
            raise InvalidRequestError("host_path", "must be an existing file or directory", host_path)
        return self.transfers.upload(self.get_sandbox(sandbox_id), host_path, path)

    def download(self, sandbox_id: str, path: str, host_path: str) -> int:
        """Copy a sandbox file or directory tree to ``host_path``; returns the files copied."""
        return self.transfers.download(self.get_sandbox(sandbox_id), path, host_path)

    # -- sessions (see session_runner) ----------------------------------------------------
    def open_session(self, sandbox_id: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        """Start a persistent bash in the sandbox; returns its session id. ``cwd`` must be
        an existing directory (else ``ConflictError`` naming it, before bash starts)."""
        sandbox = self.get_sandbox(sandbox_id)
        where = self._cwd(cwd, sandbox.layout)
        if cwd is not None:
            self.transfers.require_dir(sandbox, where, "cwd")
        return self.sessions.open(sandbox_id, validate_env(env), where)

    def run_in_session(
        self, session_id: str, command: str, *, millicores: int | None = None, numa_millicores: Sequence[int] | None = None,
        dop: int | None = None, cores: int | None = None, timeout_s: float = 60.0, max_output_bytes: int | None = None,
        cancel: threading.Event | None = None,
    ) -> ExecResult:  # fmt: skip
        """Run a command in the session's shell (state persists) under exactly the named
        grant, as ``exec``. A timeout kills the command's processes (the session's background
        jobs too) within the kill grace and keeps the shell; the result's output ends where
        the command was stopped and its ``exit_code`` is None. A close or destroy meanwhile
        ends it ``cancelled``."""
        if not isinstance(command, str) or "\0" in command:
            raise InvalidRequestError("command", "must be a string without NUL bytes", command)
        g = grant_request(self.topology, millicores=millicores, numa_millicores=numa_millicores, cores=cores, dop=dop)
        return self.sessions.run(session_id, command, g, validate_timeout(timeout_s), self._cap(max_output_bytes), cancel)

    def close_session(self, session_id: str) -> None:
        self.sessions.close(session_id)


def _safe(fn: object) -> list[str]:
    """Run a cleanup step; an exception becomes a reported problem, never a stop."""
    try:
        return list(fn())  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - close goes on past any single failure
        return [f"{type(exc).__name__}: {exc}"]


def _check_host(config: CpuManagerConfig) -> None:
    for tool in ("bwrap", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            raise CgroupUnavailableError(f"the CPU manager needs '{tool}' on PATH (Debian: apt-get install bubblewrap util-linux)")
    if os.geteuid() != 0 and not config.unisolated:
        raise CgroupUnavailableError(
            "the CPU manager must run as root to write cgroups and enter sandboxes; "
            "pass unisolated=True for an explicitly unisolated development mode"
        )


__all__ = ["CpuManager", "Grant", "ManagerClosedError", "SandboxInfo", "SandboxState"]
