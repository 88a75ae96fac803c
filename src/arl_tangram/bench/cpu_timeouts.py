"""Shell: the timed-out-actions check of ``arl-tangram bench cpu``: thousands of concurrent
actions whose timeouts (1 ms up) all fire before their program ends.

Each action runs ``sleep <unique length>; echo post-`` with a timeout far below the sleep.
A watcher thread scans the host's processes for those unique lengths. Counted against the
kill grace (``CpuManagerConfig.kill_grace_s``):
  * ``timed_out_alive_after_grace``: actions with a process seen alive after their ``exec``
    returned (the kill and its wait happen before it returns) or whose run lasted longer than
    timeout + grace (its own clock starts before the spawn);
  * ``timed_out_post_marker``: timed-out actions whose output shows ``post-``;
  * ``timeout_wrong_outcome``: actions that did not end ``timed_out``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager

TIMEOUTS_S = (0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)
SLEEP_S = 3.0
SPEC = SandboxSpec(mem_bytes=512 << 20, pids_max=512, workspace_bytes=16 << 20, tmp_bytes=16 << 20)


class _Watcher:
    """Scans /proc until stopped; ``last_seen[token]`` = monotonic start of the last scan
    that found a process carrying ``token`` in its command line."""

    def __init__(self, tokens: set[str]) -> None:
        self._wanted = {t.encode(): t for t in tokens}
        self.last_seen: dict[str, float] = {}
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
            self._stop.wait(0.1)

    def scan(self) -> None:
        t = time.monotonic()
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    words = f.read().split(b"\0")
            except OSError:
                continue
            for w in words:
                token = self._wanted.get(w)
                if token is not None:
                    self.last_seen[token] = t


def bench_timeouts(mgr: CpuManager, n: int, n_sandboxes: int) -> dict[str, object]:
    """``n`` concurrent timed-out actions over ``n_sandboxes`` sandboxes (see the module)."""
    print(f"[bench cpu] {n} concurrent actions with timeouts {TIMEOUTS_S[0]:g}-{TIMEOUTS_S[-1]:g} s", file=sys.stderr, flush=True)
    grace_s = mgr.config.kill_grace_s
    sandboxes = [mgr.create_sandbox(SPEC) for _ in range(n_sandboxes)]
    jobs = [(sandboxes[i % n_sandboxes], TIMEOUTS_S[i % len(TIMEOUTS_S)], f"{SLEEP_S:g}.{i:06d}") for i in range(n)]
    returned: dict[str, float] = {}

    def one(job: tuple[str, float, str]) -> tuple[str, float, bool, bool, float]:
        sid, timeout_s, token = job
        r = mgr.exec(sid, f"sleep {token}; echo post-", timeout_s=timeout_s)
        returned[token] = time.monotonic()
        return token, timeout_s, r.outcome == "timed_out", b"post-" in r.stdout, r.wall_s

    t0 = time.perf_counter()
    try:
        with _Watcher({job[2] for job in jobs}) as watcher, ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(one, jobs))
    finally:
        for sid in sandboxes:
            mgr.destroy_sandbox(sid)
    alive = sum(
        1 for token, timeout_s, _, _, wall_s in results
        if watcher.last_seen.get(token, 0.0) > returned[token] or wall_s > timeout_s + grace_s
    )  # fmt: skip
    return {
        "timeout_actions": n,
        "kill_grace_s": grace_s,
        "timed_out_alive_after_grace": alive,
        "timed_out_post_marker": sum(1 for _, _, timed_out, post, _ in results if timed_out and post),
        "timeout_wrong_outcome": sum(1 for _, _, timed_out, _, _ in results if not timed_out),
        "timeout_max_wall_over_s": max(wall_s - timeout_s for _, timeout_s, _, _, wall_s in results),
        "timeout_bench_s": time.perf_counter() - t0,
    }
