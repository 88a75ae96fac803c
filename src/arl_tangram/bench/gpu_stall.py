"""Shell: the loop-stall part of ``bench gpu``: does swapping stall the asyncio loop?

A second thread alternates two services of ``swap_bytes`` each that cannot both be resident
(load one, evict it, load the other, ...) through the mechanism API, while the event loop
runs a 10-ms heartbeat and calls a small resident service with ``run_async`` every 20 ms.
- ``loop_stall_p99_ms``: p99 of the heartbeat's lateness over ``duration_s`` of churn;
- ``resident_call_slowdown_during_swaps``: the small service's median call latency during
  the churn / without it.

Method: the churn runs in windows of ``window_s`` that alternate with windows without it
(``duration_s`` of each in all), in one loop, and every heartbeat and call is classed by
whether it overlapped a swap (a load and its evict). On a shared host the load of other
processes drifts over seconds; classing samples from interleaved windows compares the two
conditions under the same drift, where "quiet first, then churn" compared two different
moments of the host. ``loop_stall_p99_ms_without_swaps`` is the same heartbeat's p99 when
no swap ran: what the host alone costs.
"""

from __future__ import annotations

import asyncio
import bisect
import statistics
import threading
import time
from typing import Any

Interval = tuple[float, float]


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


class _Churn:
    """The swapping thread: load/evict cycles while ``on`` is set; records each cycle's span."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.on = threading.Event()
        self.stop = threading.Event()
        self.spans: list[Interval] = []
        self.load_s: list[float] = []
        self.thread = threading.Thread(target=self._run, name="arl-tangram-bench-churn")

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            if not self.on.wait(0.05):
                continue
            rid, started = f"big{n}", time.perf_counter()
            self.load_s.append(self.manager.load(rid, "big_a" if n % 2 else "big_b", [0]))
            self.manager.evict(rid)
            self.spans.append((started, time.perf_counter()))
            n += 1


async def _phase(
    manager: Any, duration_s: float, churn: _Churn | None = None, window_s: float = 1.0
) -> tuple[list[Interval], list[Interval]]:
    """Heartbeat and call samples as (start, end) over ``duration_s``; with ``churn``, it is
    switched on and off every ``window_s``."""
    beats: list[Interval] = []
    calls: list[Interval] = []
    stop = time.perf_counter() + duration_s

    async def heartbeat() -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            beats.append((started, time.perf_counter()))

    async def caller() -> None:
        while time.perf_counter() < stop:
            started = time.perf_counter()
            await manager.run_async("small", {"tokens": [1, 2, 3, 4, 5, 6, 7, 8]})
            calls.append((started, time.perf_counter()))
            await asyncio.sleep(0.02)

    async def switch() -> None:
        assert churn is not None
        while time.perf_counter() < stop:
            churn.on.set()
            await asyncio.sleep(window_s)
            churn.on.clear()
            await asyncio.sleep(window_s)

    tasks = [heartbeat(), caller()] + ([switch()] if churn is not None else [])
    await asyncio.gather(*tasks)
    return beats, calls


def _split(samples: list[Interval], spans: list[Interval]) -> tuple[list[float], list[float]]:
    """Durations (ms) of samples that overlapped a span, and of those that did not."""
    starts = [s for s, _ in spans]
    ends = [e for _, e in spans]  # spans are disjoint and in order (one thread made them)
    during: list[float] = []
    outside: list[float] = []
    for start, end in samples:
        i = bisect.bisect_left(ends, start)  # the first span ending after the sample starts
        overlaps = i < len(spans) and starts[i] < end
        (during if overlaps else outside).append((end - start) * 1e3)
    return during, outside


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else 0.0


def measure(
    spec: Any, small_folder: Any, swap_bytes: int, duration_s: float, window_s: float = 1.0
) -> dict[str, Any]:
    """``spec``: the device (its budget is replaced to hold one big service and the small one)."""
    import dataclasses

    from arl_tangram.managers.gpu import GpuManager

    budget = int(swap_bytes * 1.5) + (64 << 20)
    window_s = min(window_s, duration_s / 2)  # at least two windows of each kind
    with GpuManager([dataclasses.replace(spec, mem_bytes=budget)]) as manager:
        manager.register_folder("small", small_folder, "logprobs")
        manager.register_module("big_a", _blob(swap_bytes), "embed")
        manager.register_module("big_b", _blob(swap_bytes), "embed")
        manager.load("small", "small", [0])
        asyncio.run(_phase(manager, 0.5))  # warm-up
        churn = _Churn(manager)
        churn.thread.start()
        try:
            beats, calls = asyncio.run(_phase(manager, 2 * duration_s, churn, window_s))
        finally:
            churn.stop.set()
            churn.thread.join()
    late_during, late_outside = _split(beats, churn.spans)
    busy, quiet = _split(calls, churn.spans)
    late_during = [max(0.0, ms - 10.0) for ms in late_during]  # lateness past the 10 ms
    late_outside = [max(0.0, ms - 10.0) for ms in late_outside]
    return {
        "loop_stall_p99_ms": _p99(late_during),
        "loop_stall_max_ms": max(late_during, default=0.0),
        "loop_stall_p99_ms_without_swaps": _p99(late_outside),
        "resident_call_slowdown_during_swaps": statistics.median(busy) / statistics.median(quiet),
        "resident_call_p50_ms_quiet": statistics.median(quiet),
        "resident_call_p50_ms_during_swaps": statistics.median(busy),
        "num_calls": [len(busy), len(quiet)],
        "num_heartbeats": [len(late_during), len(late_outside)],
        "num_swaps": len(churn.spans),
        "swap_bytes": swap_bytes,
        "swap_s_median": statistics.median(churn.load_s) if churn.load_s else 0.0,
        "duration_s": duration_s,
        "window_s": window_s,
    }
