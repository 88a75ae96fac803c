"""Shell: the manager's table of persistent shell sessions and the grant around each run.

Who calls: ``CpuManager`` (``open_session``, ``run_in_session``, ``close_session``,
``destroy_sandbox``). Runs of one session are serialised by the session's lock; sessions of
one sandbox may run concurrently, each in its own slot with its own grant (the same grant
semantics as ``exec``: session CPU is granted by the caller, never implicit).

Races end in defined outcomes: a close or destroy during a run kills the shell (without
waiting for the run), the run returns ``cancelled``, and only then is the slot released
(under the session's lock, so a slot is never reused while a run still uses it).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Protocol

from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.config import CpuManagerConfig
from arl_tangram.managers.cpu.errors import SandboxNotFoundError
from arl_tangram.managers.cpu.grants import GrantRequest, grant_request
from arl_tangram.managers.cpu.results import ExecResult, Outcome, classify
from arl_tangram.managers.cpu.sandbox import Sandbox, SandboxGoneError
from arl_tangram.managers.cpu.session import SessionRun, ShellSession
from arl_tangram.managers.cpu.topology import CpuTopology


class SessionHost(Protocol):
    """What sessions need of the CPU manager that owns them (``CpuManager`` is one)."""

    config: CpuManagerConfig
    driver: CgroupDriver
    topology: CpuTopology

    def get_sandbox(self, sandbox_id: str) -> Sandbox: ...

    def reserve(self, g: GrantRequest) -> tuple[int, ...]: ...

    def release(self, cpus: tuple[int, ...]) -> None: ...

    def base_env(self, sandbox_id: str, dop: int) -> dict[str, str]: ...


class SessionRegistry:
    def __init__(self, manager: SessionHost) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._sessions: dict[str, ShellSession] = {}

    def open(self, sandbox_id: str, env: dict[str, str], cwd: str) -> str:
        """Start bash in a new slot (granted one core while it starts; parked after)."""
        mgr = self._manager
        sb = mgr.get_sandbox(sandbox_id)
        cpus = mgr.reserve(grant_request(mgr.topology, cores=1))
        try:
            slot = sb.begin(cpus, 1000, kind="session")
            session = ShellSession(f"{sandbox_id}.{secrets.token_hex(4)}", sb, mgr.driver, slot, kill_grace_s=mgr.config.kill_grace_s)
            try:
                session.start({**mgr.base_env(sandbox_id, 1), **env}, cwd)
            except BaseException:
                session.kill()
                session.close_pipes()
                sb.end(slot, keep="free")
                raise
            sb.end(slot, keep="session")
        finally:
            mgr.release(cpus)
        with self._lock:
            self._sessions[session.session_id] = session
        return session.session_id

    def _get(self, session_id: str) -> ShellSession:
        with self._lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise SandboxNotFoundError(f"session_id: no open session {session_id!r}")
        return session

    def run(self, session_id: str, command: str, g: GrantRequest, timeout_s: float, cap: int, cancel: threading.Event | None) -> ExecResult:
        session = self._get(session_id)
        mgr, sb = self._manager, session.sandbox
        cpus = mgr.reserve(g)
        try:
            with session.lock:
                if session.closed or session.closing:
                    return ExecResult(outcome=Outcome.CANCELLED, exit_code=None, millicores=g.millicores)
                try:
                    sb.begin(cpus, g.millicores, slot=session.slot, kind="session")
                except SandboxGoneError:
                    return ExecResult(outcome=Outcome.CANCELLED, exit_code=None, millicores=g.millicores)
                try:
                    return self._run_granted(session, command, g, timeout_s, cap, cancel)
                finally:
                    sb.end(session.slot, keep="session")
        finally:
            mgr.release(cpus)
            if session.closed and not session.closing:
                self._drop(session)  # the shell exited by itself (e.g. ``exit 7``)

    def _run_granted(self, session: ShellSession, command: str, g: GrantRequest, timeout_s: float, cap: int, cancel: threading.Event | None) -> ExecResult:
        drv, sb = self._manager.driver, session.sandbox
        seen = sb.slot_cpus(session.slot)
        dop = g.dop or max(1, len(seen))
        t0 = time.perf_counter()
        drv.reset_slot_counters(sb.group, session.slot)
        oom_before = drv.oom_kills(sb.group)
        # the DoP of this run, visible to the command (the shell's env persists otherwise)
        run = session.run(f"export TANGRAM_DOP={dop}\n{command}", timeout_s=timeout_s, cap_bytes=cap, cancel=cancel)
        wall_s = time.perf_counter() - t0
        gone = session.closing or sb.is_destroying
        error = None if gone or sb.alive() else f"sandbox died during the command: {sb.dead_reason}"
        outcome = _outcome(run, gone, drv.oom_kills(sb.group) - oom_before, error)
        out, out_cut, out_n = run.stdout.content()
        err, err_cut, err_n = run.stderr.content()
        return ExecResult(
            outcome=outcome, exit_code=run.exit_code, stdout=out, stderr=err,
            stdout_truncated=out_cut, stderr_truncated=err_cut, stdout_bytes=out_n, stderr_bytes=err_n,
            wall_s=wall_s, cpu_s=drv.slot_cpu_ns(sb.group, session.slot) / 1e9,
            peak_mem_bytes=drv.slot_peak_bytes(sb.group, session.slot), cores=len(seen), cpus=seen,
            millicores=g.millicores,
            error=error if error or outcome is not Outcome.ERROR else "the session's shell exited",
        )  # fmt: skip

    def close(self, session_id: str) -> None:
        """Kill the session's shell, then (after any run in progress returned) free its slot;
        unknown ids raise ``SandboxNotFoundError``."""
        with self._lock:
            session = self._sessions.pop(session_id, None) if isinstance(session_id, str) else None
        if session is None:
            raise SandboxNotFoundError(f"session_id: no open session {session_id!r}")
        session.closing = True
        sb = session.sandbox
        token = None
        try:
            if not sb.is_destroying and sb.alive():
                token = sb.add_grant(1000)  # frozen tasks die only once thawed
            session.kill()
        except SandboxGoneError:
            pass  # the destroy kills the shell
        finally:
            if token is not None:
                sb.remove_grant(token)
        with session.lock:  # waits for a run in progress to return
            session.close_pipes()
            sb.end(session.slot, keep="free")

    def _drop(self, session: ShellSession) -> None:
        with self._lock:
            if self._sessions.get(session.session_id) is session:
                del self._sessions[session.session_id]
        session.kill()
        session.close_pipes()
        session.sandbox.end(session.slot, keep="free")

    def count(self, sandbox_id: str) -> int:
        """How many sessions of ``sandbox_id`` are open."""
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.sandbox.sandbox_id == sandbox_id)

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Drop the sessions of a sandbox being destroyed (its destroy kills their shells;
        runs in progress end cancelled)."""
        with self._lock:
            doomed = [s for sid, s in self._sessions.items() if s.sandbox.sandbox_id == sandbox_id]
            for s in doomed:
                del self._sessions[s.session_id]
        for s in doomed:
            s.closing = True


def _outcome(run: SessionRun, gone: bool, oom_kills: int, error: str | None) -> Outcome:
    if gone:
        return Outcome.CANCELLED
    outcome = classify(exit_code=run.exit_code, timed_out=run.timed_out, cancelled=run.cancelled, oom_kills=oom_kills, error=error)
    if run.session_died and outcome is Outcome.SUCCEEDED:
        return Outcome.FAILED
    return outcome
