"""Shell: ``arl-tangram bench cpu [--json]``, the live benchmark of the CPU manager.

Measures on this host, with real sandboxes: cold sandbox creation, one grant + reclaim
(Allocate-on-Execution resize) against a restart with new limits, entering a sandbox to run
``true``, how closely a busy action's CPU matches its grant, and the CPU and memory that idle
sandboxes (each with a background busy loop) cost, and hardening: destroy of a sandbox
holding 500 busy tasks (``--destroy-tasks``), what a ``kill -9`` of a manager leaves, and processes left by actions
that fork a background child, and timeouts that always kill (``cpu_timeouts``: 2,000
concurrent actions timed out from 1 ms up, none alive past the kill grace). Progress goes to stderr; ``--json`` prints
exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence

from arl_tangram.bench.cpu_timeouts import bench_timeouts
from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager

BUSY = "for i in 1 2 3; do timeout {s} sh -c 'while :; do :; done' & done; wait"
IDLE_LOOP = "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &"
_CRASHER = textwrap.dedent(
    """
    import threading, time
    from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig, SandboxSpec
    spec = SandboxSpec(mem_bytes=128 << 20, pids_max=64, workspace_bytes=8 << 20, tmp_bytes=8 << 20)
    mgr = CpuManager(CpuManagerConfig(default_spec=spec))
    for _ in range(10):
        sid = mgr.create_sandbox()
        mgr.exec(sid, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &", background=True)
        threading.Thread(target=mgr.exec, args=(sid, "while :; do :; done"), kwargs={"timeout_s": 600}, daemon=True).start()
    time.sleep(0.5)
    pids = sorted({p for sid in mgr.list_sandboxes() for p in mgr.driver.sandbox_pids(mgr.get_sandbox(sid).group)})
    print(mgr.root_name, *pids, flush=True)
    time.sleep(600)
    """
)
SPEC = SandboxSpec(mem_bytes=256 << 20, pids_max=64, workspace_bytes=64 << 20, tmp_bytes=16 << 20)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _progress(msg: str) -> None:
    print(f"[bench cpu] {msg}", file=sys.stderr, flush=True)


def _mem_used_bytes() -> int:
    info: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


def bench_create(mgr: CpuManager, n: int) -> dict[str, float]:
    _progress(f"create/destroy {n} sandboxes (cold, no pool)")
    create_s, destroy_s = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sid = mgr.create_sandbox(SPEC)
        create_s.append(time.perf_counter() - t0)
        destroy_s.append(_timed(lambda sid=sid: mgr.destroy_sandbox(sid)))  # type: ignore[misc]
    return {
        "create_p50_ms": statistics.median(create_s) * 1e3, "create_p99_ms": _pct(create_s, 0.99) * 1e3,
        "destroy_p50_ms": statistics.median(destroy_s) * 1e3,
    }  # fmt: skip


def bench_resize_restart(mgr: CpuManager, n_resize: int, n_restart: int) -> dict[str, float]:
    _progress(f"resize (grant + reclaim) x{n_resize}, restart x{n_restart}")
    sid = mgr.create_sandbox(SPEC)
    cores = min(2, len(mgr.topology.cpus))
    resize_s = [_timed(lambda n=1 + i % cores: mgr.reclaim(mgr.grant(sid, n))) for i in range(n_resize)]  # type: ignore[misc]
    mgr.destroy_sandbox(sid)
    restart_s = []
    sid = mgr.create_sandbox(SPEC)
    for i in range(n_restart):
        spec = SandboxSpec(mem_bytes=SPEC.mem_bytes + (i % 2) * (64 << 20), pids_max=64, workspace_bytes=SPEC.workspace_bytes, tmp_bytes=SPEC.tmp_bytes)
        t0 = time.perf_counter()
        mgr.destroy_sandbox(sid)
        sid = mgr.create_sandbox(spec)
        restart_s.append(time.perf_counter() - t0)
    mgr.destroy_sandbox(sid)
    resize_p50 = statistics.median(resize_s)
    restart_p50 = statistics.median(restart_s)
    return {
        "resize_p50_us": resize_p50 * 1e6, "resize_p99_us": _pct(resize_s, 0.99) * 1e6,
        "restart_p50_ms": restart_p50 * 1e3, "resize_vs_restart": restart_p50 / resize_p50,
    }  # fmt: skip


def bench_exec(mgr: CpuManager, n: int) -> dict[str, float]:
    _progress(f"exec true x{n}")
    sid = mgr.create_sandbox(SPEC)
    for _ in range(5):
        mgr.exec(sid, ["true"])
    walls = []
    for _ in range(n):
        r = mgr.exec(sid, ["true"])
        assert r.ok, r
        walls.append(r.wall_s)
    session = mgr.open_session(sid)
    sess = [mgr.run_in_session(session, "true").wall_s for _ in range(n)]
    mgr.destroy_sandbox(sid)
    return {
        "exec_true_p50_ms": statistics.median(walls) * 1e3, "exec_true_p99_ms": _pct(walls, 0.99) * 1e3,
        "session_true_p50_ms": statistics.median(sess) * 1e3,
    }  # fmt: skip


def bench_enforce(mgr: CpuManager, seconds: float) -> dict[str, object]:
    _progress(f"enforcement: 3 busy processes for {seconds:.0f}s granted 1 and {len(mgr.topology.cpus)} cores")
    sid = mgr.create_sandbox(SPEC)
    used: dict[str, float] = {}
    errors = []
    for cores in sorted({1, min(2, len(mgr.topology.cpus))}):
        r = mgr.exec(sid, BUSY.format(s=seconds), cores=cores, timeout_s=seconds * 5)
        used[str(cores)] = r.cpu_s / r.wall_s
        errors.append(abs(used[str(cores)] - cores) / cores)
    mgr.destroy_sandbox(sid)
    return {"enforce_error": max(errors), "enforce_used_cores": used, "host_loadavg_1m": os.getloadavg()[0]}


def bench_idle(mgr: CpuManager, n_busy: int, n_total: int, seconds: float) -> dict[str, float]:
    _progress(f"idle: {n_busy} sandboxes with a background busy loop, {n_total} held at once")
    mem_before = _mem_used_bytes()
    sids: list[str] = []
    for i in range(n_total):
        sids.append(mgr.create_sandbox(SPEC))
        if i < n_busy:
            assert mgr.exec(sids[-1], IDLE_LOOP, background=True).ok  # kept past its action on purpose
        if (i + 1) % 100 == 0:
            _progress(f"  {i + 1}/{n_total} sandboxes up")
    time.sleep(0.5)
    mem_host = (_mem_used_bytes() - mem_before) / n_total
    mem_cgroup = sum(mgr.driver.sandbox_memory_bytes(mgr.get_sandbox(s).group) for s in sids) / n_total
    groups = [mgr.get_sandbox(s).group for s in sids[:n_busy]]
    cpu0 = sum(mgr.driver.sandbox_cpu_ns(g) for g in groups)
    time.sleep(seconds)
    idle_cores = (sum(mgr.driver.sandbox_cpu_ns(g) for g in groups) - cpu0) / 1e9 / seconds
    _progress(f"  destroying {n_total} sandboxes")
    for sid in sids:
        mgr.destroy_sandbox(sid)
    return {
        "idle_cpu_cores": idle_cores, "idle_busy_sandboxes": n_busy, "idle_sandboxes": n_total,
        "idle_mem_mb_per_sandbox": max(mem_host, mem_cgroup) / 2**20,
        "idle_mem_mb_per_sandbox_host": mem_host / 2**20, "idle_mem_mb_per_sandbox_cgroup": mem_cgroup / 2**20,
    }  # fmt: skip


def bench_destroy_busy(mgr: CpuManager, n_tasks: int) -> dict[str, float]:
    _progress(f"destroy of an idle sandbox holding {n_tasks} busy tasks")
    sid = mgr.create_sandbox(SandboxSpec(mem_bytes=1 << 30, pids_max=n_tasks + 64, workspace_bytes=8 << 20, tmp_bytes=8 << 20))
    r = mgr.exec(sid, f"for i in $(seq {n_tasks}); do (while :; do :; done) & done", background=True, timeout_s=120)
    assert r.ok, r
    t0 = time.perf_counter()
    mgr.destroy_sandbox(sid)
    return {"destroy_busy_ms": (time.perf_counter() - t0) * 1e3}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def bench_kill9(spec: SandboxSpec, settle_s: float = 10.0) -> dict[str, int]:
    """kill -9 of a manager process holding 10 busy sandboxes, then a new manager starts:
    processes + cgroup directories + mounts of the dead manager left after ``settle_s``."""
    _progress("kill -9 of a manager holding 10 busy sandboxes, then a new manager")
    child = subprocess.Popen([sys.executable, "-c", _CRASHER], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    root, *pid_text = child.stdout.readline().split()
    pids = [int(p) for p in pid_text]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    with CpuManager(CpuManagerConfig(default_spec=spec)):
        pass

    def left() -> tuple[int, int, int]:
        dirs = [d for d in glob.glob(f"/sys/fs/cgroup/*/{root}/**", recursive=True) if os.path.isdir(d)]
        mounts = 0
        for pid in pids:
            if _alive(pid):
                mounts += 1  # its mount namespace lives as long as it does
        return sum(_alive(p) for p in pids), len(dirs), mounts

    deadline = time.monotonic() + settle_s
    while sum(left()) and time.monotonic() < deadline:
        time.sleep(0.05)
    procs, dirs, mounts = left()
    return {"leftovers_after_kill9": procs + dirs + mounts, "kill9_procs_seen": len(pids)}


def bench_action_leftovers(mgr: CpuManager, n: int) -> dict[str, int]:
    _progress(f"{n} actions that each fork a background child")
    sid = mgr.create_sandbox(SPEC)
    for _ in range(n):
        assert mgr.exec(sid, "sleep 300 & while :; do :; done & echo $!").ok
    group = mgr.get_sandbox(sid).group
    init_slot = set(mgr.driver.slot_pids(group, "init"))
    armed = mgr.get_sandbox(sid).armed_pids()  # a launcher waiting for the next run (``armed``)
    left = [p for p in mgr.driver.sandbox_pids(group) if p not in init_slot and p not in armed]
    mgr.destroy_sandbox(sid)
    return {"action_leftover_procs": len(left)}


TARGETS = {
    "create_p50_ms": ("<=", 30), "resize_p99_us": ("<=", 1000), "exec_true_p50_ms": ("<=", 5),
    "enforce_error": ("<=", 0.10), "idle_cpu_cores": ("<=", 0.02), "idle_mem_mb_per_sandbox": ("<=", 5),
    "destroy_busy_ms": ("<=", 1000), "leftovers_after_kill9": ("<=", 0), "action_leftover_procs": ("<=", 0),
    "timed_out_alive_after_grace": ("<=", 0), "timed_out_post_marker": ("<=", 0), "timeout_wrong_outcome": ("<=", 0),
}  # fmt: skip


def _table(result: dict[str, object]) -> str:
    lines = [f"{'metric':34} {'value':>12}  target"]
    for key, value in result.items():
        target = TARGETS.get(key)
        shown = f"{value:12.3f}" if isinstance(value, float) else f"{value!s:>12}"
        mark = ""
        if target is not None and isinstance(value, int | float):
            mark = f"{target[0]} {target[1]}  " + ("ok" if value <= target[1] else "MISSED")
        lines.append(f"{key:34} {shown}  {mark}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--creates", type=int, default=50)
    parser.add_argument("--resizes", type=int, default=500)
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--enforce-seconds", type=float, default=2.0)
    parser.add_argument("--idle-sandboxes", type=int, default=100, help="idle sandboxes running a busy loop")
    parser.add_argument("--held-sandboxes", type=int, default=500, help="sandboxes held at once for memory")
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--timeout-actions", type=int, default=2000, help="concurrent actions that all time out")
    parser.add_argument("--timeout-sandboxes", type=int, default=50)
    parser.add_argument("--destroy-tasks", type=int, default=500, help="busy tasks in the sandbox whose destroy is timed")
    parser.add_argument("--leftover-actions", type=int, default=100, help="actions that each fork a background child")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    with CpuManager(CpuManagerConfig(default_spec=SPEC)) as mgr:
        result: dict[str, object] = {"cgroup": mgr.driver.describe().split(":")[0], "cpus": len(mgr.topology.cpus)}
        result.update(bench_create(mgr, args.creates))
        result.update(bench_resize_restart(mgr, args.resizes, args.restarts))
        result.update(bench_exec(mgr, args.execs))
        result.update(bench_enforce(mgr, args.enforce_seconds))
        result.update(bench_idle(mgr, args.idle_sandboxes, max(args.held_sandboxes, args.idle_sandboxes), args.idle_seconds))
        result.update(bench_destroy_busy(mgr, args.destroy_tasks))
        result.update(bench_action_leftovers(mgr, args.leftover_actions))
        result.update(bench_timeouts(mgr, args.timeout_actions, args.timeout_sandboxes))
    result.update(bench_kill9(SPEC))
    result["bench_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in result.items()}))
    else:
        print(_table(result))
    return 0
