"""Shell: the timed-out-actions check of ``arl-tangram bench cpu``: thousands of concurrent
actions whose timeouts (1 ms up) all fire before their program ends.

Each action runs ``sleep <unique length>; echo post-`` with a timeout far below the sleep.
A watcher thread scans the host's processes for those unique lengths. Counted against the
kill grace (``CpuManagerConfig.kill_grace_s``):
  * ``timed_out_alive_after_grace``: actions with a process seen alive after their ``exec``
    returned (the kill and its wait happen before it returns) or seen alive longer than
    timeout + grace after it started (``/proc`` start times);
  * ``timed_out_post_marker``: timed-out actions whose output shows ``post-``;
  * ``timeout_wrong_outcome``: actions that did not end ``timed_out``;
  * how late the manager's own thread acted (``timeout_stop_late_*``: deadline noticed,
    ``timeout_killed_late_max_s``: kill done) and how many runs the launcher's own timer
    ended first (``timeout_ended_by_launcher_timer``): on a loaded host the manager's threads
    run late, and the launcher's kernel-timed kill keeps the deadline.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager

TIMEOUTS_S = (0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)
SLEEP_S = 3.0
_TOKEN = re.compile(rb"3\.\d{6}")  # a job's sleep length: SLEEP_S and its index, fixed width
_TICKS = os.sysconf("SC_CLK_TCK")
SPEC = SandboxSpec(mem_bytes=512 << 20, pids_max=512, workspace_bytes=16 << 20, tmp_bytes=16 << 20)


class _Watcher:
    """Scans /proc until stopped for processes whose command line carries a token (the
    sandboxed ``sleep`` and the shell around it): ``born[token]`` = the earliest such
    process's start, ``last_seen[token]`` = the start of the last scan that found one, both
    on the boot clock (``/proc/<pid>/stat`` start times are in its ticks)."""

    def __init__(self) -> None:
        self.born: dict[bytes, float] = {}
        self.last_seen: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeout-watcher", daemon=True)

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.scan()  # one last look after every action returned

    def _run(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(0.05)

    def scan(self) -> None:
        t = time.clock_gettime(time.CLOCK_BOOTTIME)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    tokens = set(_TOKEN.findall(f.read()))
                if not tokens:
                    continue
                with open(f"/proc/{name}/stat", "rb") as f:
                    born = int(f.read().rsplit(b")", 1)[1].split()[19]) / _TICKS
            except (OSError, ValueError, IndexError):
                continue
            for token in tokens:
                self.born[token] = min(born, self.born.get(token, born))
                self.last_seen[token] = t


def _violations(watcher: _Watcher, jobs: list[tuple[str, float, str]], returned: dict[str, float], grace_s: float) -> int:
    """Actions with a process alive after their ``exec`` returned, or that lived longer than
    timeout + grace (the launcher starts before the program, so this is the strict side)."""
    bad = 0
    for _, timeout_s, token in jobs:
        key = token.encode()
        if key not in watcher.last_seen:
            continue  # never seen alive: killed before a scan found it
        lived_s = watcher.last_seen[key] - watcher.born[key]
        bad += watcher.last_seen[key] > returned[token] or lived_s > timeout_s + grace_s
    return bad


def bench_timeouts(mgr: CpuManager, n: int, n_sandboxes: int) -> dict[str, object]:
    """``n`` concurrent timed-out actions over ``n_sandboxes`` sandboxes (see the module)."""
    print(f"[bench cpu] {n} concurrent actions with timeouts {TIMEOUTS_S[0]:g}-{TIMEOUTS_S[-1]:g} s", file=sys.stderr, flush=True)
    grace_s = mgr.config.kill_grace_s
    sandboxes = [mgr.create_sandbox(SPEC) for _ in range(n_sandboxes)]
    jobs = [(sandboxes[i % n_sandboxes], TIMEOUTS_S[i % len(TIMEOUTS_S)], f"{SLEEP_S:g}.{i:06d}") for i in range(n)]
    returned: dict[str, float] = {}  # boot clock, as the watcher's

    def one(job: tuple[str, float, str]) -> dict[str, Any]:
        sid, timeout_s, token = job
        r = mgr.exec(sid, f"sleep {token}; echo post-", timeout_s=timeout_s)
        returned[token] = time.clock_gettime(time.CLOCK_BOOTTIME)
        return {
            "timed_out": r.outcome == "timed_out", "post": b"post-" in r.stdout,
            # the manager's own stop (absent when the launcher's timer ended the run first)
            "stop_late_s": r.timings["stop_s"] - timeout_s if "stop_s" in r.timings else None,
            "killed_late_s": r.timings["killed_s"] - timeout_s if "killed_s" in r.timings else None,
        }  # fmt: skip

    t0 = time.perf_counter()
    try:
        with _Watcher() as watcher, ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(one, jobs))
    finally:
        for sid in sandboxes:
            mgr.destroy_sandbox(sid)
    stop_late = [r["stop_late_s"] for r in results if r["stop_late_s"] is not None]
    return {
        "timeout_actions": n,
        "kill_grace_s": grace_s,
        "timed_out_alive_after_grace": _violations(watcher, jobs, returned, grace_s),
        "timeout_seen_alive": len(watcher.last_seen),
        "timed_out_post_marker": sum(1 for r in results if r["timed_out"] and r["post"]),
        "timeout_wrong_outcome": sum(1 for r in results if not r["timed_out"]),
        "timeout_ended_by_launcher_timer": sum(1 for r in results if r["stop_late_s"] is None),
        "timeout_stop_late_p50_s": statistics.median(stop_late) if stop_late else 0.0,
        "timeout_stop_late_max_s": max(stop_late, default=0.0),
        "timeout_killed_late_max_s": max((r["killed_late_s"] for r in results if r["killed_late_s"] is not None), default=0.0),
        "timeout_bench_s": time.perf_counter() - t0,
    }
