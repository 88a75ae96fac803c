"""Shell: the loop-stall part of ``bench gpu``: does swapping stall the asyncio loop?

A second thread alternates two services of ``swap_bytes`` each that cannot both be resident
(load one, evict it, load the other, ...) through the mechanism API, while the event loop
runs a 10-ms heartbeat and calls a small resident service with ``run_async``.
- ``loop_stall_p99_ms``: p99 of the heartbeat's lateness over ``duration_s`` of churn;
- ``resident_call_slowdown_during_swaps``: the small service's median call latency during the
  churn / without it (measured first, same loop, same calls).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from typing import Any


def _blob(nbytes: int) -> Any:
    import torch

    from arl_tangram.managers.gpu import LoadedModel

    def build() -> Any:
        module = torch.nn.Module()
        chunk = 64 << 20
        for i in range(0, nbytes, chunk):
            module.register_buffer(
                f"t{i // chunk}", torch.zeros(min(chunk, nbytes - i), dtype=torch.uint8)
            )
        return LoadedModel(module, vocab_size=1, max_length=1)

    return build


async def _phase(manager: Any, duration_s: float) -> tuple[list[float], list[float]]:
    """Heartbeat lateness (ms) and small-call latencies (ms) over ``duration_s``."""
    lateness: list[float] = []
    calls: list[float] = []
    stop = time.perf_counter() + duration_s

    async def heartbeat() -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            lateness.append((time.perf_counter() - started - 0.01) * 1e3)

    async def caller() -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await manager.run_async("small", {"tokens": [1, 2, 3, 4, 5, 6, 7, 8]})
            calls.append((time.perf_counter() - started) * 1e3)
            await asyncio.sleep(0.02)

    await asyncio.gather(heartbeat(), caller())
    return lateness, calls


def measure(spec: Any, small_folder: Any, swap_bytes: int, duration_s: float) -> dict[str, Any]:
    """``spec``: the device (its budget is replaced to hold one big service and the small one)."""
    import dataclasses

    from arl_tangram.managers.gpu import GpuManager

    budget = int(swap_bytes * 1.5) + (64 << 20)
    with GpuManager([dataclasses.replace(spec, mem_bytes=budget)]) as manager:
        manager.register_folder("small", small_folder, "logprobs")
        manager.register_module("big_a", _blob(swap_bytes), "embed")
        manager.register_module("big_b", _blob(swap_bytes), "embed")
        manager.load("small", "small", [0])
        asyncio.run(_phase(manager, 0.5))  # warm-up
        _, quiet = asyncio.run(_phase(manager, max(2.0, duration_s / 3)))
        stop = threading.Event()
        swaps: list[float] = []

        def churn() -> None:
            n = 0
            while not stop.is_set():
                rid = f"big{n}"
                swaps.append(manager.load(rid, "big_a" if n % 2 else "big_b", [0]))
                manager.evict(rid)
                n += 1

        thread = threading.Thread(target=churn, name="arl-tangram-bench-churn")
        thread.start()
        try:
            lateness, busy = asyncio.run(_phase(manager, duration_s))
        finally:
            stop.set()
            thread.join()
    return {
        "loop_stall_p99_ms": statistics.quantiles(lateness, n=100)[98],
        "loop_stall_max_ms": max(lateness),
        "resident_call_slowdown_during_swaps": statistics.median(busy) / statistics.median(quiet),
        "resident_call_p50_ms_quiet": statistics.median(quiet),
        "resident_call_p50_ms_during_swaps": statistics.median(busy),
        "num_swaps": len(swaps),
        "swap_bytes": swap_bytes,
        "swap_s_median": statistics.median(swaps) if swaps else 0.0,
        "duration_s": duration_s,
    }
