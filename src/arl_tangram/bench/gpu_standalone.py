"""Shell: the standalone-wrapper part of ``bench gpu``: does another service's load hold up
a resident service's calls through ``StandaloneGpuManager``?

A churn thread swaps two services of ``swap_bytes`` each through the wrapper (``prefetch``
one, ``evict_service`` it, the other, ...) while a caller thread calls a small resident
service with ``call_sync`` every 20 ms. As in ``gpu_stall``, the churn runs in windows that
alternate with windows without it, and every call is classed by whether it overlapped a
swap, so both conditions see the same drift of a shared host.
- ``resident_call_p50_ms_quiet`` / ``resident_call_p50_ms_churn``: the small service's
  median call without / during swaps; ``resident_call_churn_ratio`` = churn / quiet
  (target <= 1.5: the wrapper never loads under its policy lock).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from typing import Any

from arl_tangram.bench.gpu_stall import Interval, _blob, _split

REQUEST = {"tokens": [1, 2, 3, 4, 5, 6, 7, 8]}


class _Swaps:
    """Swap cycles through the wrapper while ``on`` is set; records each cycle's span."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.on = threading.Event()
        self.stop = threading.Event()
        self.spans: list[Interval] = []
        self.thread = threading.Thread(target=self._run, name="arl-tangram-bench-swaps")

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            if not self.on.wait(0.05):
                continue
            name, started = ("big_a", "big_b")[n % 2], time.perf_counter()
            self.manager.prefetch(name)
            self.manager.evict_service(name)
            self.spans.append((started, time.perf_counter()))
            n += 1


def _calls(manager: Any, duration_s: float, swaps: _Swaps, window_s: float) -> list[Interval]:
    """The small service's calls over ``duration_s``, the churn switched every ``window_s``."""
    calls: list[Interval] = []
    stop = time.perf_counter() + duration_s
    switch_at = time.perf_counter()
    while time.perf_counter() < stop:
        if time.perf_counter() >= switch_at:
            (swaps.on.clear if swaps.on.is_set() else swaps.on.set)()
            switch_at += window_s
        started = time.perf_counter()
        manager.call_sync("small", REQUEST)
        calls.append((started, time.perf_counter()))
        time.sleep(0.02)
    swaps.on.clear()
    return calls


def measure(spec: Any, small_folder: Any, swap_bytes: int, duration_s: float, window_s: float = 1.0) -> dict[str, Any]:
    """``spec``: the device (its budget is replaced to hold one big service and the small one)."""
    from arl_tangram.managers.gpu import StandaloneGpuManager

    budget = int(swap_bytes * 1.5) + (64 << 20)
    window_s = min(window_s, duration_s / 2)
    with StandaloneGpuManager([dataclasses.replace(spec, mem_bytes=budget)]) as manager:
        manager.register_folder("small", small_folder, "logprobs")
        manager.register_module("big_a", _blob(swap_bytes), "embed")
        manager.register_module("big_b", _blob(swap_bytes), "embed")
        for _ in range(10):  # warm-up: resident, first touches done
            manager.call_sync("small", REQUEST)
        swaps = _Swaps(manager)
        swaps.thread.start()
        try:
            calls = _calls(manager, 2 * duration_s, swaps, window_s)
        finally:
            swaps.stop.set()
            swaps.thread.join()
        small_loads = manager.num_loads.get("small", 0)
    churn, quiet = _split(calls, swaps.spans)
    p50_churn, p50_quiet = statistics.median(churn), statistics.median(quiet)
    return {
        "resident_call_p50_ms_quiet": p50_quiet,
        "resident_call_p50_ms_churn": p50_churn,
        "resident_call_churn_ratio": p50_churn / p50_quiet,
        "resident_call_p99_ms_churn": statistics.quantiles(churn, n=100)[98] if len(churn) > 1 else 0.0,
        "num_calls": [len(churn), len(quiet)],
        "num_swaps": len(swaps.spans),
        "small_loads": small_loads,  # 1: the small service stayed resident throughout
        "swap_bytes": swap_bytes,
    }
