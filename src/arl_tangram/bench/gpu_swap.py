"""Shell: the swap-in part of ``bench gpu``: how close does a swap-in come to a raw copy?

- raw copy: one plain host -> device ``copy_`` of the model's bytes into a preallocated
  device buffer, in the caller's thread (pinned source and a non-blocking copy on CUDA):
  what the hardware does with those bytes, the physical limit of a swap-in;
- swap-in: ``GpuManager.load`` of the same model after ``evict`` (reserve an extent, copy,
  bind the replica's module), the manager's real path.

Method: the two are measured interleaved, ``raw, swap, raw, swap, ..., swap, raw``, and each
swap-in is compared with the mean of the raw copy just before it and the one just after it.
On a shared host the memory bandwidth a copy gets drifts with other processes' load; two
figures taken at different moments (or the medians of two lists, whose middle elements can
come from different rounds) compare two states of the host. A bracketed pair sees the same
state, and a drift that is linear over one round cancels. ``swap_efficiency`` is the median
of the per-round ratios (raw seconds / swap-in seconds), with p25 and p75 beside it;
warm-up rounds (first touch, lazy inits, the skeleton pool's first return) are discarded.
A wide p25-p75 (or a low ``swap_efficiency_by_round`` stretch) means the host's load changed
within rounds: on CPU devices the copy runs on a thread at nice +10 (``copier.py``), which
loses to other processes' load where a raw copy at nice 0 does not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

WARMUP_ROUNDS = 2


def sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def raw_copier(torch: Any, device: Any, payload: int) -> Callable[[], float]:
    """One plain host -> device copy of ``payload`` bytes (pinned on CUDA); returns seconds."""
    on_cuda = device.type == "cuda"
    source = torch.ones(payload, dtype=torch.uint8)
    source = source.pin_memory() if on_cuda else source
    target = torch.zeros(payload, dtype=torch.uint8, device=device)

    def raw() -> float:
        sync(torch, device)
        started = time.perf_counter()
        target.copy_(source, non_blocking=on_cuda)
        sync(torch, device)
        return time.perf_counter() - started

    return raw


def bracketed_ratios(raws_s: list[float], swaps_s: list[float]) -> list[float]:
    """Raw seconds / swap-in seconds per round; ``raws_s[i]`` and ``raws_s[i + 1]`` were
    measured just before and just after ``swaps_s[i]`` (so one raw more than swaps)."""
    if len(raws_s) != len(swaps_s) + 1 or not swaps_s:
        raise ValueError(f"need n >= 1 swaps and n + 1 raws, got {len(swaps_s)}, {len(raws_s)}")
    return [(raws_s[i] + raws_s[i + 1]) / 2 / swap for i, swap in enumerate(swaps_s)]


def summarise(raws_s: list[float], swaps_s: list[float], payload: int) -> dict[str, Any]:
    """The bench's swap figures from the timed (post-warm-up) rounds."""
    ratios = bracketed_ratios(raws_s, swaps_s)
    p25, median, p75 = (
        statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    )
    raw_s, swap_s = statistics.median(raws_s), statistics.median(swaps_s)
    return {
        "raw_copy_gbps": payload / raw_s / 1e9,
        "raw_copy_s": raw_s,
        "swap_in_gbps": payload / swap_s / 1e9,
        "swap_in_s": swap_s,
        "swap_efficiency": median,
        "swap_efficiency_p25": p25,
        "swap_efficiency_p75": p75,
        "swap_efficiency_rounds": len(ratios),
        "swap_efficiency_by_round": [round(ratio, 3) for ratio in ratios],
    }


def measure(spec: Any, folder: Any, payload: int, rounds: int) -> dict[str, Any]:
    """Interleaved raw copies and swap-ins of the model in ``folder`` (``payload`` bytes of
    weights) on the device ``spec``, ``rounds`` timed rounds after ``WARMUP_ROUNDS``."""
    import torch

    from arl_tangram.managers.gpu import GpuManager

    raw = raw_copier(torch, torch.device(spec.torch_device), payload)
    with GpuManager([spec]) as manager:
        manager.register_folder("model", folder, "logprobs")
        manager.load("model", "model", [0])

        def swap() -> float:
            manager.evict("model")
            started = time.perf_counter()
            manager.load("model", "model", [0])
            return time.perf_counter() - started

        raws_s, swaps_s = [raw()], []
        for _ in range(WARMUP_ROUNDS + max(1, rounds)):
            swaps_s.append(swap())
            raws_s.append(raw())
        footprint = manager.footprint_bytes("model", 1)
    out = summarise(raws_s[WARMUP_ROUNDS:], swaps_s[WARMUP_ROUNDS:], payload)
    out["model_footprint_bytes"] = footprint
    return out
