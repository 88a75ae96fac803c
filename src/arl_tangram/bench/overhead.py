"""Bench: what the controller costs an action, in process (``arl-tangram bench overhead``).

- ``inproc_submit_to_start_p50_ms`` / ``_p99_ms``: from submitting an action that needs no
  resource to the executor starting it (one controller round: event, scheduler step,
  decision applied), one at a time through the embedded controller.
- ``actions_per_s_inproc``: such actions completed per second by 32 concurrent callers of
  the SDK.
- ``overhead_share_1s_actions``: one-second busy loops in one real sandbox, one at a time
  through the SDK; mean of (ACT - the execution time the loop measured inside the sandbox)
  / ACT, where ACT is the caller's wall time from the call to its result. Queueing, the
  cgroup resize, the launch into the sandbox and the result's way back all count.
- ``http_submit_to_start_p50_ms`` / ``_p99_ms`` and ``http_noop_actions_per_s``: the same
  no-resource actions through the HTTP service (``overhead_http``: a real ``arl-tangram
  serve`` subprocess, 32 concurrent keep-alive clients, one action per request).

Prints one flat JSON object with ``--json``; figures are whatever was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import arl_tangram
from arl_tangram.bench.overhead_http import measure_http
from arl_tangram.client import AsyncClient
from arl_tangram.core.action import ActionSpec
from arl_tangram.runtime.actions import NoopPayload

# A bash busy loop of one second that reports when it began and ended, by its own clock.
BUSY_1S = (
    't0=$EPOCHREALTIME; end=$(( ${t0/./} + 1000000 )); '
    'while (( ${EPOCHREALTIME/./} < end )); do :; done; echo "$t0 $EPOCHREALTIME"'
)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def submit_to_start_ms(tg: AsyncClient, n: int) -> list[float]:
    controller = tg.transport.controller  # type: ignore[attr-defined]
    samples: list[float] = []
    for i in range(n):
        t0 = time.monotonic()
        record = controller.submit(ActionSpec(f"noop-{i}", "noop"), NoopPayload())
        await record.done
        assert record.started_s is not None and record.done.result().ok
        samples.append((record.started_s - t0) * 1000.0)
        controller.store.forget(f"noop-{i}")
    return samples


async def noop_throughput(tg: AsyncClient, callers: int, duration_s: float) -> float:
    done = 0
    deadline = time.monotonic() + duration_s

    async def caller() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            r = await tg.ping()
            assert r.ok, r
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return done / (time.monotonic() - started)


async def overhead_shares(tg: AsyncClient, n: int) -> tuple[list[float], list[float]]:
    env = await tg.create_env(memory="256MiB")
    shares, acts = [], []
    try:
        for _ in range(n):
            t0 = time.monotonic()
            r = await env.exec(BUSY_1S, cpu=1, timeout_s=30)
            act_s = time.monotonic() - t0
            assert r.ok, (r.outcome, r.stderr, r.cause)
            began, ended = (float(x) for x in r.stdout.split())
            shares.append((act_s - (ended - began)) / act_s)
            acts.append(act_s)
    finally:
        await env.release()
    return shares, acts


async def measure(quick: bool) -> dict[str, Any]:
    async with arl_tangram.connect() as tg:
        await tg.ping()  # warm the path (first round, imports)
        starts = await submit_to_start_ms(tg, 100 if quick else 1000)
        per_s = await noop_throughput(tg, 32, 1.0 if quick else 5.0)
        shares, acts = await overhead_shares(tg, 5 if quick else 50)
    return {
        "inproc_submit_to_start_p50_ms": round(statistics.median(starts), 4),
        "inproc_submit_to_start_p99_ms": round(_pct(starts, 0.99), 4),
        "actions_per_s_inproc": round(per_s, 1),
        "overhead_share_1s_actions": round(statistics.fmean(shares), 5),
        "overhead_1s_actions_mean_ms": round(statistics.fmean(a * s for a, s in zip(acts, shares, strict=True)) * 1000, 2),
        "act_1s_actions_mean_s": round(statistics.fmean(acts), 4),
        "samples": {"submit_to_start": len(starts), "one_second_actions": len(shares)},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "quick": quick,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="small sample sizes (tests)")
    args = parser.parse_args(argv)
    print("bench overhead: measuring (about a minute at full size)...", file=sys.stderr)
    result = asyncio.run(measure(args.quick))
    result.update(measure_http(args.quick))  # after: the in-process runtime is closed by now
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:36s} {value}")
    return 0
