"""Bench (not a test): latency and throughput of the compat faces with the real clients.

``python -m tests.compat.bench_faces [--json] [--calls N] [--concurrent N] [--verl-cases N]``
- ``run_code("print(1)")`` through our SandboxFusion face, one call at a time (p50/p99);
- ``python3 -c 'print(1)'`` through SWE-ReX's ``RemoteRuntime`` on our face and on SWE-ReX's
  own ``swerex-remote`` server (``execute`` and ``run_in_session``), one at a time;
- throughput of ``--concurrent`` simultaneous ``run_code_async`` calls;
- verl's ``check_correctness`` over ``--verl-cases`` cases at once (verl's own thread pool);
- the E2B face with the unchanged ``e2b`` SDK: ``Sandbox.create`` (``create_p50_ms``),
  ``commands.run("true")`` (``run_p50_ms``), and ``--e2b-sandboxes`` sandboxes running
  ``--e2b-runs`` short commands each at once (``concurrent_runs_per_s`` = commands / wall s).
Everything runs on this machine, on loopback; the server runs in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from arl_tangram.api.app import create_app
from arl_tangram.api.compat import mount_compat
from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import TangramConfig
from arl_tangram.runtime.config_e2b import E2bConfig

#: small sandboxes (an assumption: memory per action has not landed, so each E2B sandbox
#: holds its limit for its life; 64 of them must fit a small host)
E2B_MEM_BYTES = 128 << 20


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(1000 * statistics.median(ordered), 2),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "mean_ms": round(1000 * statistics.fmean(ordered), 2),
    }


async def _timed(calls: int, one: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    await one()  # warm: the first call creates the sandbox
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await one()
        samples.append(time.perf_counter() - t0)
    return _ms(samples)


def bench_run_code(url: str, calls: int, concurrent: int) -> dict[str, Any]:
    from sandbox_fusion import RunCodeRequest, run_code, run_code_async

    request = RunCodeRequest(code="print(1)", language="python")
    run_code(request, endpoint=url)
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        assert run_code(request, endpoint=url).run_result.stdout == "1\n"  # type: ignore[union-attr]
        samples.append(time.perf_counter() - t0)

    async def many() -> float:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(run_code_async(request, endpoint=url) for _ in range(concurrent)))
        assert all(r.run_result and r.run_result.stdout == "1\n" for r in results)
        return time.perf_counter() - t0

    wall_s = asyncio.run(many())
    return {"sequential": _ms(samples), "concurrent": concurrent, "concurrent_wall_s": round(wall_s, 3), "calls_per_s": round(concurrent / wall_s, 1)}


async def _swerex_pair(runtime: Any, calls: int) -> dict[str, Any]:
    from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest

    await runtime.create_session(CreateBashSessionRequest(session="bench"))
    execute = await _timed(calls, lambda: runtime.execute(Command(command=["python3", "-c", "print(1)"])))
    session = await _timed(calls, lambda: runtime.run_in_session(BashAction(command="python3 -c 'print(1)'", session="bench")))
    return {"execute": execute, "run_in_session": session}


def bench_swerex(url: str, calls: int) -> dict[str, Any]:
    from swerex.runtime.remote import RemoteRuntime

    import arl_tangram

    async def ours() -> dict[str, Any]:
        async with arl_tangram.connect(url) as tg:
            env = await tg.create_env(memory="512MiB")
            try:
                return await _swerex_pair(RemoteRuntime(host=f"{url}/swerex/{env.env_id}", port=None, auth_token=""), calls)
            finally:
                await env.release()

    out: dict[str, Any] = {"ours": asyncio.run(ours())}
    exe = shutil.which("swerex-remote") or os.path.join(os.path.dirname(sys.executable), "swerex-remote")
    if os.path.exists(exe):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([exe, "--port", str(port), "--auth-token", "bench"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token="bench")
            asyncio.run(runtime.wait_until_alive(timeout=30))
            out["swerex_remote"] = asyncio.run(_swerex_pair(runtime, calls))
        finally:
            proc.terminate()
            proc.wait(10)
    return out


def bench_verl(url: str, cases: int) -> dict[str, Any]:
    from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

    in_outs = {"inputs": [f"{i} {i}\n" for i in range(cases)], "outputs": [f"{2 * i}\n" for i in range(cases)]}
    t0 = time.perf_counter()
    results, _ = check_correctness(f"{url}/run_code", in_outs, "a, b = map(int, input().split())\nprint(a + b)\n")
    wall_s = time.perf_counter() - t0
    return {"cases": cases, "all_correct": results == [True] * cases, "wall_s": round(wall_s, 3), "cases_per_s": round(cases / wall_s, 1)}


def bench_e2b(url: str, calls: int, sandboxes: int, runs: int) -> dict[str, Any]:
    os.environ.update(E2B_API_URL=f"{url}/e2b", E2B_SANDBOX_URL=f"{url}/e2b", E2B_API_KEY="e2b_" + "0" * 40)
    from e2b import AsyncSandbox, Sandbox

    Sandbox.create("base", timeout=60).kill()  # warm: the first create starts the node's machinery
    creates = []
    for _ in range(max(5, calls // 5)):
        t0 = time.perf_counter()
        sb = Sandbox.create("base", timeout=60)
        creates.append(time.perf_counter() - t0)
        sb.kill()
    sb = Sandbox.create("base", timeout=300)
    try:
        sb.commands.run("true")
        runs_s = []
        for _ in range(calls):
            t0 = time.perf_counter()
            sb.commands.run("true")
            runs_s.append(time.perf_counter() - t0)
    finally:
        sb.kill()

    async def many() -> tuple[int, float]:
        boxes = await asyncio.gather(*(AsyncSandbox.create("base", timeout=300) for _ in range(sandboxes)))
        try:

            async def loop(box: Any) -> int:
                for _ in range(runs):
                    assert (await box.commands.run("echo 1")).stdout == "1\n"
                return runs

            t0 = time.perf_counter()
            done = sum(await asyncio.gather(*(loop(b) for b in boxes)))
            return done, time.perf_counter() - t0
        finally:
            await asyncio.gather(*(b.kill() for b in boxes))

    done, wall_s = asyncio.run(many())
    create, run = _ms(creates), _ms(runs_s)
    return {
        "create_p50_ms": create["p50_ms"], "create": create, "run_p50_ms": run["p50_ms"], "run": run,
        "sandboxes": sandboxes, "commands": done, "concurrent_wall_s": round(wall_s, 3),
        "concurrent_runs_per_s": round(done / wall_s, 1), "targets": {"create_p50_ms": 60, "run_p50_ms": 15},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--verl-cases", type=int, default=300)
    parser.add_argument("--e2b-sandboxes", type=int, default=64)
    parser.add_argument("--e2b-runs", type=int, default=8)
    parser.add_argument("--only", choices=("all", "e2b"), default="all", help="e2b: only the E2B face's figures")
    args = parser.parse_args()
    config = TangramConfig(e2b=E2bConfig(mem_bytes=E2B_MEM_BYTES, warm=2))
    app = create_app(config)
    mount_compat(app, config=config)
    report: dict[str, Any] = {"host_cpus": os.cpu_count()}
    with ServerThread(app) as server:
        if args.only == "e2b":
            report["e2b"] = bench_e2b(server.url, args.calls, args.e2b_sandboxes, args.e2b_runs)
            print(json.dumps(report, indent=None if args.json else 2))
            return
        report["run_code"] = bench_run_code(server.url, args.calls, args.concurrent)
        report["swerex"] = bench_swerex(server.url, args.calls)
        try:
            report["verl_check_correctness"] = bench_verl(server.url, args.verl_cases)
        except ImportError:
            report["verl_check_correctness"] = "verl not installed"
        try:
            report["e2b"] = bench_e2b(server.url, args.calls, args.e2b_sandboxes, args.e2b_runs)
        except ImportError:
            report["e2b"] = "e2b not installed"
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
