"""Shell: the manager's table of persistent shell sessions and the grant around each run.

Who calls: ``CpuManager`` (``open_session``, ``run_in_session``, ``close_session``,
``destroy_sandbox``). Runs of one session are serialised; sessions of one sandbox may run
concurrently, each with its own grant.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import TYPE_CHECKING

from arl_tangram.managers.cpu.errors import SandboxDeadError, SandboxNotFoundError
from arl_tangram.managers.cpu.results import ExecResult, Outcome, classify
from arl_tangram.managers.cpu.session import ShellSession

if TYPE_CHECKING:
    from arl_tangram.managers.cpu.manager import CpuManager


class SessionRegistry:
    def __init__(self, manager: CpuManager) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._sessions: dict[str, ShellSession] = {}

    def open(self, sandbox_id: str, env: dict[str, str], cwd: str) -> str:
        mgr = self._manager
        sb = mgr.get_sandbox(sandbox_id)
        session = None
        grant = mgr.grant(sandbox_id, 1)  # bash must run to start; the sandbox is frozen otherwise
        try:
            with sb.lock:
                slot = sb.acquire_slot()
            session = ShellSession(f"{sandbox_id}.{secrets.token_hex(4)}", sb, mgr.driver, slot)
            session.start({**mgr.base_env(sandbox_id, 1), **env}, cwd)
        except BaseException:
            if session is not None:
                session.kill()
            raise
        finally:
            mgr.reclaim(grant)
        with self._lock:
            self._sessions[session.session_id] = session
        return session.session_id

    def _get(self, session_id: str) -> ShellSession:
        with self._lock:
            session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise SandboxNotFoundError(f"session_id: no open session {session_id!r}")
        return session

    def run(self, session_id: str, command: str, cores: int, timeout_s: float, cap: int, cancel: threading.Event | None) -> ExecResult:
        session = self._get(session_id)
        mgr, sb = self._manager, session.sandbox
        with session.lock:
            if session.closed:
                raise SandboxDeadError(f"session {session_id} has exited; open a new one")
            grant = mgr.grant(sb.sandbox_id, cores)
            t0 = time.perf_counter()
            try:
                mgr.driver.reset_slot_counters(sb.group, session.slot)
                oom_before = mgr.driver.oom_kills(sb.group)
                # the DoP of this run, visible to the command (the shell's env persists otherwise)
                run = session.run(f"export TANGRAM_DOP={cores}\n{command}", timeout_s=timeout_s, cap_bytes=cap, cancel=cancel)
                wall_s = time.perf_counter() - t0
                cpu_s = mgr.driver.slot_cpu_ns(sb.group, session.slot) / 1e9
                peak = mgr.driver.slot_peak_bytes(sb.group, session.slot)
                oom = mgr.driver.oom_kills(sb.group) - oom_before
                error = None if sb.alive() else f"sandbox died during the command: {sb.dead_reason}"
            finally:
                mgr.reclaim(grant)
        out, out_cut, out_n = run.stdout.content()
        err, err_cut, err_n = run.stderr.content()
        outcome = classify(exit_code=run.exit_code, timed_out=run.timed_out, cancelled=run.cancelled, oom_kills=oom, error=error)
        if run.session_died and outcome is Outcome.SUCCEEDED:
            outcome = Outcome.FAILED
        if run.session_died:
            self.close(session_id)
        return ExecResult(
            outcome=outcome, exit_code=run.exit_code, stdout=out, stderr=err,
            stdout_truncated=out_cut, stderr_truncated=err_cut, stdout_bytes=out_n, stderr_bytes=err_n,
            wall_s=wall_s, cpu_s=cpu_s, peak_mem_bytes=peak, cores=grant.cores, cpus=grant.cpus,
            error=error if error else ("the session's shell exited" if run.session_died else None),
        )  # fmt: skip

    def close(self, session_id: str) -> None:
        """Kill the session's shell and free its slot; unknown ids raise."""
        with self._lock:
            session = self._sessions.pop(session_id, None) if isinstance(session_id, str) else None
        if session is None:
            raise SandboxNotFoundError(f"session_id: no open session {session_id!r}")
        sb = session.sandbox
        if sb.alive():
            grant = self._manager.grant(sb.sandbox_id, 1)  # a frozen task dies only once thawed
            try:
                session.kill()
            finally:
                self._manager.reclaim(grant)
        else:
            session.kill()
        with sb.lock:
            sb.release_slot(session.slot)

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Drop the sessions of a sandbox being destroyed (its destroy kills their shells)."""
        with self._lock:
            doomed = [s for sid, s in self._sessions.items() if s.sandbox.sandbox_id == sandbox_id]
            for s in doomed:
                del self._sessions[s.session_id]
        for s in doomed:
            s.closed = True
