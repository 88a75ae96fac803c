"""Shell: the fragmentation part of ``bench gpu``: load/evict churn on the real buddy allocator.

Zipf-popular services of realistic sizes (Qwen2.5-shaped 0.5B-14B models in bf16 and a
MiniLM-sized reward) come and go on an 80 GiB arena with 2 MiB blocks, placed the way
``GpuManager`` places them, under each compaction mode. Pure accounting: no torch.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

# (hidden, layers, intermediate, vocab) of Qwen2.5 0.5B, 1.5B, 3B, 7B, 14B; plus a 22M encoder.
_REALISTIC_SHAPES = [
    (896, 24, 4864, 151936),
    (1536, 28, 8960, 151936),
    (2048, 36, 11008, 151936),
    (3584, 28, 18944, 152064),
    (5120, 48, 13824, 152064),
    (384, 6, 1536, 30522),
]


def _realistic_block_sizes(min_block_bytes: int) -> list[list[int]]:
    from arl_tangram.managers.gpu.layout import plan_layout

    plans = []
    for hidden, layers, inter, vocab in _REALISTIC_SHAPES:
        layer = [hidden * hidden * 2] * 4 + [hidden * inter * 2] * 3 + [hidden * 2] * 2
        sizes = [vocab * hidden * 2] + layer * layers + [hidden * 2, vocab * hidden * 2]
        plans.append(list(plan_layout(sizes, min_block_bytes).block_sizes_bytes))
    return plans


def _churn(seed: int, steps: int, mode: str) -> dict[str, Any]:
    """Zipf-popular services come and go on the real allocator, placed like ``GpuManager``
    places them: on a miss, relocate (``plan_room``) before evicting LRU; "eager" also
    compacts fully after each eviction; "off" only evicts."""
    from arl_tangram.managers.gpu.buddy import BuddyModel
    from arl_tangram.managers.gpu.compaction import final_blocks, plan_compaction, plan_room

    allocator, rng = BuddyModel(80 << 30, 2 << 20), random.Random(seed)
    plans = _realistic_block_sizes(2 << 20)
    services = [rng.choice(plans) for _ in range(24)]
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(services))]
    resident: dict[str, list[Any]] = {}
    last_used: dict[str, int] = {}
    moves: list[Any] = []
    ratios: dict[str, list[float]] = {"block": [], "extent": [], "bound": []}
    num_evictions = 0
    for step in range(steps):
        choice = rng.choices(range(len(services)), weights)[0]
        name = f"s{choice:02d}"
        last_used[name] = step
        while name not in resident:
            room = [] if mode == "off" else plan_room(allocator, resident, services[choice])
            resident.update(final_blocks(resident, room or []))
            moves += room or []
            blocks = allocator.allocate_all(services[choice])
            if blocks is not None:
                resident[name] = blocks
                break
            victim = min((s for s in resident if s != name), key=lambda s: last_used[s])
            allocator.free_all(resident.pop(victim))
            num_evictions += 1
            if mode == "eager":
                compaction = plan_compaction(allocator, resident)
                resident.update(final_blocks(resident, compaction))
                moves += compaction
        free = allocator.free_bytes
        if step >= steps // 10 and free:
            ratios["block"].append(allocator.largest_free_block_bytes() / free)
            ratios["extent"].append(allocator.largest_free_extent_bytes() / free)
            ratios["bound"].append((1 << (free.bit_length() - 1)) / free)  # best any buddy can do
    allocator.check_invariants()
    return {
        "largest_free_block_ratio": statistics.fmean(ratios["block"]),
        "largest_free_extent_ratio": statistics.fmean(ratios["extent"]),
        "largest_free_block_ratio_bound": statistics.fmean(ratios["bound"]),
        "num_samples": len(ratios["block"]),
        "num_evictions": num_evictions,
        "num_relocations": len(moves),
        "relocated_bytes": sum(m.source.size_bytes for m in moves),
    }


def measure(seed: int, steps: int, relocate_bps: float) -> dict[str, Any]:
    """Figures per compaction mode; the headline is "eager", the manager's default on CUDA."""
    from arl_tangram.managers.gpu.manager import COMPACTION_MODES

    modes = {mode: _churn(seed, steps, mode) for mode in COMPACTION_MODES}
    for figures in modes.values():
        figures["relocation_s"] = figures["relocated_bytes"] / relocate_bps
    out = dict(modes["eager"])
    out.update(compaction="eager", relocate_gbps=relocate_bps / 1e9, modes=modes)
    return out
