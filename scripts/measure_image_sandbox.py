"""Measure image sandboxes against host-root ones on this node (issue 19's CPU-side figures).

    PYTHONPATH=$PWD/src:$PWD python scripts/measure_image_sandbox.py [--rounds 200] [--creates 4]

Prints JSON: exec_true_p50_ms_image / _host (alternating runs in one process, so both see
the same load), create_seq_p50_ms_image / _host (one creator, alternating), and
create_warm_p50_ms / _p99_ms: 16 threads each creating ``--creates``
sandboxes on an image whose layer is on disk (no pool: an image create never takes a pooled
sandbox), then the same on the host root (pool off) for comparison; the load average says
how busy the host was. The image is the tests' small host-file image, built in a temp dir
and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tests.managers.cpu.image_tree import build_base

from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.rootfs import ImageRoot

SPEC = {"mem_bytes": 128 << 20, "pids_max": 128, "workspace_bytes": 64 << 20, "tmp_bytes": 32 << 20}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def exec_true(mgr: CpuManager, root: ImageRoot, rounds: int) -> dict[str, float]:
    sids = {"host": mgr.create_sandbox(SandboxSpec(**SPEC)), "image": mgr.create_sandbox(SandboxSpec(**SPEC, root=root))}
    times: dict[str, list[float]] = {"host": [], "image": []}
    for i in range(rounds):
        for kind in ("host", "image") if i % 2 else ("image", "host"):
            t0 = time.perf_counter()
            assert mgr.exec(sids[kind], ["true"]).ok
            times[kind].append(time.perf_counter() - t0)
    for sid in sids.values():
        mgr.destroy_sandbox(sid)
    return {f"exec_true_p50_ms_{k}": round(statistics.median(v) * 1e3, 3) for k, v in times.items()}


def warm_creates(mgr: CpuManager, root: ImageRoot | None, creates: int, creators: int = 16) -> dict[str, float]:
    lat: list[float] = []
    made: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(creators)

    def creator() -> None:
        start.wait()
        for _ in range(creates):
            t0 = time.perf_counter()
            sid = mgr.create_sandbox(SandboxSpec(**SPEC, root=root))
            with lock:
                lat.append(time.perf_counter() - t0)
                made.append(sid)

    threads = [threading.Thread(target=creator) for _ in range(creators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sid in made:
        mgr.destroy_sandbox(sid)
    kind = "" if root is not None else "_host"
    return {f"create_warm_p50_ms{kind}": round(_pct(lat, 0.5) * 1e3, 2), f"create_warm_p99_ms{kind}": round(_pct(lat, 0.99) * 1e3, 2)}


def sequential_creates(mgr: CpuManager, root: ImageRoot, n: int = 30) -> dict[str, float]:
    """One creator, create then destroy, alternating image and host (same load for both)."""
    lat: dict[str, list[float]] = {"image": [], "host": []}
    for i in range(2 * n):
        kind = "image" if i % 2 == 0 else "host"
        t0 = time.perf_counter()
        sid = mgr.create_sandbox(SandboxSpec(**SPEC, root=root if kind == "image" else None))
        lat[kind].append(time.perf_counter() - t0)
        mgr.destroy_sandbox(sid)
    return {f"create_seq_p50_ms_{k}": round(statistics.median(v) * 1e3, 2) for k, v in lat.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--creates", type=int, default=4)
    args = ap.parse_args()
    top = Path(tempfile.mkdtemp(prefix="tangram-measure-"))
    try:
        root = ImageRoot(lower_dirs=(build_base(top / "base"),), writable_bytes=64 << 20)
        with CpuManager(CpuManagerConfig()) as mgr:
            mgr.create_sandbox(SandboxSpec(**SPEC, root=root))  # warm the page cache and the helper
            out = {**exec_true(mgr, root, args.rounds), **sequential_creates(mgr, root), **warm_creates(mgr, root, args.creates),
                   **warm_creates(mgr, None, args.creates), "creators": 16, "creates_each": args.creates * 16}  # fmt: skip
        out["load_average_1m"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(top)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
