"""Shell: run one action (a program) inside a granted sandbox and account for it.

Who calls: ``CpuManager`` after it has granted cores and acquired a slot; this module does
not touch grants. The action's process tree is exactly the slot's tasks, so a timeout or a
cancel kills the tree (including daemons it forked) and nothing else; the sandbox survives.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu import reaper
from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.cgroup_null import kill_tree
from arl_tangram.managers.cpu.launch import (
    HOST_ENV,
    LAUNCH_FAILED_RC,
    LAUNCH_MARK,
    join_then_exec,
    native_argv,
    nsenter_argv,
)
from arl_tangram.managers.cpu.native_launcher import launcher_path
from arl_tangram.managers.cpu.proc_io import pump
from arl_tangram.managers.cpu.results import ExecResult, classify
from arl_tangram.managers.cpu.sandbox import Sandbox


@dataclass(frozen=True)
class ActionRequest:
    """A validated program run. ``env`` is the complete environment inside the sandbox."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdin: bytes | None
    timeout_s: float
    max_output_bytes: int


def spawn_in_slot(sandbox: Sandbox, slot: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, stdin_pipe: bool) -> subprocess.Popen[bytes]:
    """Start ``argv`` inside the sandbox, its process already in ``slot``'s cgroups."""
    join = sandbox.slot_join_files(slot)
    launcher = launcher_path()
    if launcher is not None:
        full = native_argv(launcher, join, sandbox.init_pid, sandbox.layout, cwd, env, argv)
    else:
        full = join_then_exec(join, nsenter_argv(sandbox.init_pid, sandbox.layout, cwd, env, argv))
    return reaper.spawn(
        full, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=HOST_ENV,
    )  # fmt: skip


def _stop(driver: CgroupDriver, sandbox: Sandbox, slot: str, launcher_pid: int) -> None:
    driver.kill_slot(sandbox.group, slot)  # the whole tree, daemons included
    kill_tree(launcher_pid)  # what a cgroup-less (unisolated) run can still find


def run_action(
    sandbox: Sandbox, driver: CgroupDriver, slot: str, req: ActionRequest, grant: tuple[tuple[int, ...], int], cancel: threading.Event | None
) -> ExecResult:
    """Run ``req`` to its end in ``slot`` (granted ``grant`` = (cpus, cores)); never raises
    for the program's own failures, only returns a result naming the outcome."""
    t0 = time.perf_counter()
    driver.reset_slot_counters(sandbox.group, slot)
    oom_before = driver.oom_kills(sandbox.group)
    proc = spawn_in_slot(sandbox, slot, req.argv, req.env, req.cwd, req.stdin is not None)
    t_spawned = time.perf_counter()
    res = pump(
        proc, stdin=req.stdin, timeout_s=req.timeout_s, cap_bytes=req.max_output_bytes,
        cancel=cancel, on_stop=lambda: _stop(driver, sandbox, slot, proc.pid),
    )  # fmt: skip
    wall_s = time.perf_counter() - t0
    reaper.release(proc)
    error = None
    if res.returncode == LAUNCH_FAILED_RC and bytes(res.stderr.data).startswith(LAUNCH_MARK):
        error = "launcher failed: " + bytes(res.stderr.data).decode(errors="replace").strip()
    elif not sandbox.alive():
        error = f"sandbox died during the action: {sandbox.dead_reason}"
    oom_kills = driver.oom_kills(sandbox.group) - oom_before
    outcome = classify(exit_code=res.returncode, timed_out=res.timed_out, cancelled=res.cancelled, oom_kills=oom_kills, error=error)
    return ExecResult(
        outcome=outcome, exit_code=res.returncode,
        stdout=bytes(res.stdout.data), stderr=bytes(res.stderr.data),
        stdout_truncated=res.stdout.truncated, stderr_truncated=res.stderr.truncated,
        stdout_bytes=res.stdout.total_bytes, stderr_bytes=res.stderr.total_bytes,
        wall_s=wall_s, cpu_s=driver.slot_cpu_ns(sandbox.group, slot) / 1e9,
        peak_mem_bytes=driver.slot_peak_bytes(sandbox.group, slot),
        cores=grant[1], cpus=grant[0], error=error,
        timings={"spawn_s": t_spawned - t0},
    )  # fmt: skip
