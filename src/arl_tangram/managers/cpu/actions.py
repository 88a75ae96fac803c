"""Shell: run one action (a program) inside a granted sandbox and account for it.

Who calls: ``CpuManager`` after the sandbox applied the grant to a slot; this module does
not touch grants. The action's process tree is exactly the slot's tasks: when the program
exits (any outcome) whatever it left running is killed, daemons included, unless the caller
asked for ``background=True``; a timeout or a cancel kills the tree and nothing else. The
launcher is spared when the program exits by itself (it reaps its child and exits, so no
orphan reaches the host); a timeout or a cancel kills the launcher *first* (see ``_stop``),
because until it has joined the slot's cgroups and forked, no cgroup kill can reach what it
is about to start.
Infrastructure trouble never raises: it becomes ``error`` with the cause, or ``cancelled``
when the sandbox is being destroyed.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu.armed import Armory
from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.cgroup_kill import KILL_GRACE_S, is_host_level
from arl_tangram.managers.cpu.cgroup_null import kill_tree
from arl_tangram.managers.cpu.errors import CpuManagerError
from arl_tangram.managers.cpu.exit_held import program_exit_held
from arl_tangram.managers.cpu.fd_ready import readable
from arl_tangram.managers.cpu.launch import (
    HOST_ENV,
    LAUNCH_FAILED_RC,
    LAUNCH_MARK,
    LAUNCH_TIMEOUT_MARK,
    LAUNCH_TIMEOUT_RC,
    NOTICE_FD_ENV,
    join_then_exec,
    native_argv,
    native_run,
    nsenter_argv,
)
from arl_tangram.managers.cpu.native_launcher import launcher_path
from arl_tangram.managers.cpu.proc_io import EXIT_HOLD_S, OutputSink, PumpResult, pump
from arl_tangram.managers.cpu.results import ExecResult, Outcome, classify
from arl_tangram.managers.cpu.run_watch import RunWatcher
from arl_tangram.managers.cpu.sandbox import Sandbox

#: the launcher's own timer fires this long after the run's deadline. It is a backstop for a
#: manager whose threads run late; set at the deadline itself it raced the manager's stop
#: (a vfork spawn takes under a millisecond, a select wakes ~2 ms late), and won, so a
#: demoted run was killed at its floor CPU weight instead of promoted first (``_stop``).
LAUNCHER_BACKSTOP_MARGIN_S = EXIT_HOLD_S + 0.1  # after the wait for a held exit too (``exit_held``)
#: how long a stop waits for the launcher to end its program on SIGTERM before SIGKILL
STOP_ASK_S = 0.5
#: how long the end of a run that killed tasks waits for them to be reaped (``settle_reaped``)
REAP_WAIT_S = 1.0


@dataclass(frozen=True)
class ActionRequest:
    """A validated program run. ``env`` is the complete environment inside the sandbox."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdin: bytes | None
    timeout_s: float
    max_output_bytes: int
    background: bool = False
    on_output: OutputSink | None = None  # live chunks while it runs (proc_io.OutputSink)
    kill_grace_s: float = KILL_GRACE_S  # a timed-out action's processes are gone within this
    # time it spent paused at its memory limit so far: pushed onto its deadline (paused
    # time is queue time, never execution); the launcher's own backstop timer is then off
    paused_s: Callable[[], float] | None = None
    # served on the pumping thread while the program runs (``run_watch``): its memory
    # grant's watch
    watchers: tuple[RunWatcher, ...] = ()
    # called once the program is forked (the launcher's cgroup joins done; the slot's
    # counters were reset before): its CPU from then on is this run's, and a demotion
    # may land (``preempt.RunHandle.counting``)
    on_counting: Callable[[], None] | None = None
    armory: Armory | None = None  # the slot's armed launcher is used when there is one (``armed``)


def spawn_in_slot(
    sandbox: Sandbox, slot: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, stdin_pipe: bool,
    timeout_s: float | None = None, notice_fd: int | None = None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start ``argv`` inside the sandbox, its process already in ``slot``'s cgroups. With
    ``timeout_s`` the native launcher also kills the program's process group on its own
    timer from the program's fork (a backstop kept by the kernel: ``_run`` sets it
    ``LAUNCHER_BACKSTOP_MARGIN_S`` after ``pump``'s deadline, which then comes first unless
    the manager's threads run late). With ``notice_fd`` (a pipe's write end) the native
    launcher writes one byte on it once the program is forked (``started_notice``)."""
    join = sandbox.slot_join_files(slot)
    launcher = launcher_path()
    launcher_env = HOST_ENV
    pass_fds: tuple[int, ...] = ()
    if launcher is not None:
        full = native_argv(launcher, join, sandbox.init_pid, sandbox.layout, cwd, env, argv, _timeout_ms(timeout_s))
        if notice_fd is not None:
            launcher_env, pass_fds = {**HOST_ENV, NOTICE_FD_ENV: str(notice_fd)}, (notice_fd,)
    elif sandbox.layout.root is not None:  # the fallback keeps every capability: never on an image
        raise CpuManagerError(f"sandbox {sandbox.sandbox_id}: actions on an image root need the native launcher")
    else:
        full = join_then_exec(join, nsenter_argv(sandbox.init_pid, sandbox.layout, cwd, env, argv))
    return subprocess.Popen(
        full, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=launcher_env, pass_fds=pass_fds,
    )  # fmt: skip


def _timeout_ms(timeout_s: float | None) -> int:
    return 0 if timeout_s is None else max(1, math.ceil(timeout_s * 1000))


def started_notice() -> tuple[int, int]:
    """(read end, write end) of a pipe for ``spawn_in_slot(notice_fd=...)``: the read end
    turns readable once the program is forked, its cgroup joins done (a byte), or once the
    launcher is gone without forking it (EOF). Without the native launcher nothing is
    written, and EOF comes when the program exits."""
    return os.pipe2(os.O_CLOEXEC)


def _stop(driver: CgroupDriver, sandbox: Sandbox, slot: str, proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """End a timed-out or cancelled action wherever its launcher is: not yet in the slot's
    cgroups, joined but not yet forked, or waiting on the program.

    The launcher forks the program only after it joined the slot, so once the launcher is
    dead nothing new can appear in the slot: kill it, wait (up to ``grace_s``) until it is
    gone, and only then kill the slot, whose task list is then complete. Killing the slot
    first (as before) let a launcher that had not joined yet start the program afterwards,
    which ran to its end under the ``timed_out`` label. The launcher is our child and not yet
    reaped (``pump`` reaps it after this returns), so its pid cannot have been reused."""
    # A demoted run (preemption) sits at the floor CPU weight: its killed tasks, and the
    # freezer that stops them, need CPU to finish, which a busy host barely lends that
    # weight (measured: looping runs of a 3-s timeout ended 5-19 s after their start).
    # Back at its normal weight, a timeout ends the run at its timeout, as on a server.
    sandbox.promote()
    if driver.version == 0:
        # unisolated: no cgroup lists the tree, only /proc does (a daemon escapes it); with
        # cgroups the frozen slot kill below ends the tree at once, never a child before its
        # parent (a shell that saw its child die would run its next command)
        kill_tree(proc.pid, spare_root=True)
    # SIGTERM first: a launcher that forked kills and reaps its program, then exits (one
    # that had not forked just dies). Killed first, it left the program an orphan of the
    # host's init, whose late reaping kept the zombie in the sandbox's pids budget: the next
    # run of a fork bomb's sandbox could not fork (CI, chaos suite).
    for sig, wait_s in ((signal.SIGTERM, min(grace_s, STOP_ASK_S)), (signal.SIGKILL, grace_s)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        if _wait_exited(proc.pid, wait_s):
            break
    driver.kill_slot(sandbox.group, slot)  # the whole tree, daemons included


def _wait_exited(pid: int, timeout_s: float) -> bool:
    """Wait until child ``pid`` has exited, leaving it unreaped: the thread sleeps on the
    process's pidfd (readable once it exited, zombie or not) without the interpreter lock.
    It used to poll ``waitid(WNOHANG|WNOWAIT)`` every 0.5-10 ms: when 30 looping runs hit
    their timeout together, those polls were 3,000 lock wake-ups a second that the event loop
    then waited behind (issue 26)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already reaped
    try:
        return readable(pidfd, timeout_s)
    finally:
        os.close(pidfd)


def _timings(spawn_s: float, started: float, res: PumpResult) -> dict[str, float]:
    """``spawn_s``; for a stopped run also ``stop_s`` (when its deadline or cancel was acted
    on) and ``killed_s`` (when its processes were gone), both from its start; for one whose
    exit the kernel held at its deadline, ``exit_held_s`` (first seen held, from its start)."""
    out = {"spawn_s": spawn_s}
    if res.stop_at is not None and res.killed_at is not None:
        out.update(stop_s=res.stop_at - started, killed_s=res.killed_at - started)
    if res.held_at is not None:
        out["exit_held_s"] = res.held_at - started
    return out


def end_of_action(driver: CgroupDriver, sandbox: Sandbox, slot: str) -> tuple[int, str | None]:
    """Kill what the action left in its slot: (tasks killed, error when some survived, in
    which case the sandbox is marked dead: its pids budget can no longer be trusted)."""
    leftovers = [p for p in driver.slot_pids(sandbox.group, slot) if not is_host_level(p)]
    if not leftovers:
        return 0, None
    left = driver.kill_slot(sandbox.group, slot)
    if left:
        reason = f"{left} tasks of an action survived the kill"
        sandbox.mark_dead(reason)
        return len(leftovers), reason
    return len(leftovers), None


def settle_reaped(driver: CgroupDriver, group: str, timeout_s: float = REAP_WAIT_S) -> bool:
    """Wait (bounded) until the sandbox's killed tasks are reaped, not only dead. A zombie
    keeps its place in the sandbox's pids budget until the sandbox's init reaps it, and an
    idle sandbox is frozen right after its run: a killed fork bomb's zombies then held the
    budget until the next run's thaw, whose launcher could not fork (``fork: Resource
    temporarily unavailable``; CI, the chaos suite). True once settled."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while driver.sandbox_unreaped(group) > 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    return True


def _spawn(sandbox: Sandbox, slot: str, req: ActionRequest, backstop_s: float | None) -> tuple[subprocess.Popen[bytes], int]:
    """The run's launcher and its started-notice fd: the slot's armed launcher when it has
    one (already in the slot's cgroups: it is sent the run's arguments), else a new one."""
    armory = req.armory
    if armory is not None:
        armed = armory.take(sandbox, slot)
        if armed is not None:
            try:
                run = native_run(req.cwd, req.env, req.argv, _timeout_ms(backstop_s))
                return armed.proc, armed.launch(run, req.stdin is not None)
            except OSError:
                armory.discard(armed)  # gone meanwhile: launch as usual
    notice_r, notice_w = started_notice()
    try:
        return spawn_in_slot(sandbox, slot, req.argv, req.env, req.cwd, req.stdin is not None, backstop_s, notice_w), notice_r
    except BaseException:
        os.close(notice_r)
        raise
    finally:
        os.close(notice_w)


def run_action(
    sandbox: Sandbox, driver: CgroupDriver, slot: str, req: ActionRequest, grant: tuple[tuple[int, ...], int], cancel: threading.Event | None
) -> ExecResult:
    """Run ``req`` to its end in ``slot`` (granted ``grant`` = (cpus, millicores)); never
    raises: the program's failures and the manager's own trouble are outcomes."""
    t0 = time.perf_counter()
    try:
        return _run(sandbox, driver, slot, req, grant, cancel, t0)
    except (OSError, CpuManagerError) as exc:
        if sandbox.is_destroying:
            return ExecResult(outcome=Outcome.CANCELLED, exit_code=None, wall_s=time.perf_counter() - t0,
                              cores=len(grant[0]), cpus=grant[0], millicores=grant[1])  # fmt: skip
        return ExecResult(outcome=Outcome.ERROR, exit_code=None, wall_s=time.perf_counter() - t0, cores=len(grant[0]),
                          cpus=grant[0], millicores=grant[1], error=f"{type(exc).__name__}: {exc}")  # fmt: skip


def _run(
    sandbox: Sandbox, driver: CgroupDriver, slot: str, req: ActionRequest, grant: tuple[tuple[int, ...], int],
    cancel: threading.Event | None, t0: float,
) -> ExecResult:  # fmt: skip
    driver.reset_slot_counters(sandbox.group, slot)
    # the slot's count only: a kill in another slot is another action's outcome, and one file
    # (not one per slot) is read at each end of every run
    oom_before = driver.slot_oom_kills(sandbox.group, slot)
    # The timeout counts from the program's fork (the launcher's notice): the launcher's
    # cgroup joins before it queue on the kernel's global cgroup lock, for seconds when
    # hundreds of runs start at once (issue 26: short programs timed out with no CPU used),
    # and that wait is the platform's, as queueing is. ``started`` bounds it meanwhile.
    started = time.monotonic()
    backstop_s = req.timeout_s + LAUNCHER_BACKSTOP_MARGIN_S if req.paused_s is None else None
    proc, notice_r = _spawn(sandbox, slot, req, backstop_s)
    t_spawned = time.perf_counter()
    res = pump(
        proc, stdin=req.stdin, timeout_s=req.timeout_s, cap_bytes=req.max_output_bytes, started=started,
        cancel=cancel, on_stop=lambda: _stop(driver, sandbox, slot, proc, req.kill_grace_s), on_output=req.on_output,
        stop_grace_s=req.kill_grace_s, paused_s=req.paused_s, watchers=req.watchers, started_fd=notice_r,
        exit_held=lambda: program_exit_held(driver.slot_pids(sandbox.group, slot), proc.pid), on_started=req.on_counting,
    )  # fmt: skip
    started = res.started_at
    # the launcher's own timer fired first (this thread ran late): a timeout all the same
    by_launcher = res.returncode == LAUNCH_TIMEOUT_RC and res.stderr.tail.endswith(LAUNCH_TIMEOUT_MARK)
    timed_out = res.timed_out or by_launcher
    if by_launcher and res.stderr.data.endswith(LAUNCH_TIMEOUT_MARK):
        del res.stderr.data[-len(LAUNCH_TIMEOUT_MARK) :]  # the launcher's word, not the program's
    killed, error = (0, None) if req.background and not (timed_out or res.cancelled) else end_of_action(driver, sandbox, slot)
    if killed or res.stop_at is not None:
        settle_reaped(driver, sandbox.group)
    wall_s = time.perf_counter() - t0
    cancelled = res.cancelled or sandbox.is_destroying
    if cancelled:
        error = None  # destroyed under it: the run was cancelled, not broken
    elif res.returncode == LAUNCH_FAILED_RC and bytes(res.stderr.data).startswith(LAUNCH_MARK):
        error = "launcher failed: " + bytes(res.stderr.data).decode(errors="replace").strip()
    elif not sandbox.alive():
        error = error or f"sandbox died during the action: {sandbox.dead_reason}"
    oom_kills = driver.slot_oom_kills(sandbox.group, slot) - oom_before
    outcome = classify(exit_code=res.returncode, timed_out=timed_out, cancelled=cancelled, oom_kills=oom_kills, error=error)
    return ExecResult(
        outcome=outcome, exit_code=res.returncode,
        stdout=bytes(res.stdout.data), stderr=bytes(res.stderr.data),
        stdout_truncated=res.stdout.truncated, stderr_truncated=res.stderr.truncated,
        stdout_bytes=res.stdout.total_bytes, stderr_bytes=res.stderr.total_bytes,
        wall_s=wall_s, cpu_s=driver.slot_cpu_ns(sandbox.group, slot) / 1e9,
        peak_mem_bytes=driver.slot_peak_bytes(sandbox.group, slot),
        cores=len(grant[0]), cpus=grant[0], millicores=grant[1], error=error, leftovers_killed=killed,
        timings=_timings(t_spawned - t0, started, res),
    )  # fmt: skip
