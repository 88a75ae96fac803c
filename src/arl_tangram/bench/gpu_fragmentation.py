"""Shell: the fragmentation part of ``bench gpu``: load/evict churn driving the real manager.

Zipf-popular services of realistic *shapes* (Qwen2.5 0.5B-14B in bf16 and a MiniLM-sized
reward) come and go on a real ``GpuManager`` (real arena, real copies, real compaction),
scaled down by ``scale`` so it runs on a laptop: an 80 GiB device with 2 MiB granules
becomes ``80 GiB / scale`` with ``2 MiB / scale`` granules, every tensor ``1 / scale`` of
its size. The bench plays the core: on a miss it evicts least-recently-used replicas until
the device has enough free *bytes* (never more), then calls ``load``, which must succeed by
relocating when the free bytes are fragmented. Modes: ``on_demand`` (compaction only inside
``load``) and ``eager`` (the policy also calls ``compact`` after each eviction).
"""

from __future__ import annotations

import random
import statistics
import time
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
MODES = ("on_demand", "eager")


def _tensor_sizes(scale: int) -> list[list[int]]:
    plans = []
    for hidden, layers, inter, vocab in _REALISTIC_SHAPES:
        layer = [hidden * hidden * 2] * 4 + [hidden * inter * 2] * 3 + [hidden * 2] * 2
        sizes = [vocab * hidden * 2] + layer * layers + [hidden * 2, vocab * hidden * 2]
        plans.append([max(1, s // scale) for s in sizes])
    return plans


def _blob_factory(sizes: list[int]) -> Any:
    import torch

    from arl_tangram.managers.gpu import LoadedModel

    def build() -> Any:
        module = torch.nn.Module()
        for i, nbytes in enumerate(sizes):
            module.register_buffer(f"t{i}", torch.zeros(nbytes, dtype=torch.uint8))
        return LoadedModel(module, vocab_size=1, max_length=1)

    return build


def _churn(seed: int, steps: int, mode: str, scale: int) -> dict[str, Any]:
    from arl_tangram.managers.gpu import GpuManager, GpuManagerConfig, cpu_devices

    rng = random.Random(seed)
    plans = _tensor_sizes(scale)
    config = GpuManagerConfig(granule_bytes=max(4096, (2 << 20) // scale))
    ratios: list[float] = []
    num_evictions = 0
    load_s: list[float] = []
    with GpuManager(cpu_devices([(80 << 30) // scale]), config) as manager:
        for p, sizes in enumerate(plans):
            manager.register_module(f"plan{p}", _blob_factory(sizes), "embed")
        services = [f"plan{rng.randrange(len(plans))}" for _ in range(24)]
        weights = [1 / (rank + 1) ** 1.1 for rank in range(len(services))]
        resident: dict[str, int] = {}  # replica id -> last use
        for step in range(steps):
            choice = rng.choices(range(len(services)), weights)[0]
            rid = f"s{choice:02d}"
            if rid not in resident:
                need = manager.footprint_bytes(services[choice], 1)
                while manager.device_free_bytes()[0] < need:
                    victim = min(resident, key=lambda r: resident[r])
                    manager.evict(victim)
                    del resident[victim]
                    num_evictions += 1
                    if mode == "eager":
                        manager.compact(0)
                started = time.perf_counter()
                manager.load(rid, services[choice], [0])
                load_s.append(time.perf_counter() - started)
            resident[rid] = step
            device = manager.status()["devices"][0]
            if step >= steps // 10 and device["free_bytes"]:
                ratios.append(device["largest_free_extent_bytes"] / device["free_bytes"])
        manager.check_invariants()
        device = manager.status()["devices"][0]
    return {
        "largest_free_extent_ratio": statistics.fmean(ratios) if ratios else 1.0,
        "largest_free_extent_ratio_p10": statistics.quantiles(ratios, n=10)[0]
        if len(ratios) > 1
        else 1.0,
        "num_samples": len(ratios),
        "num_evictions": num_evictions,
        "num_loads": len(load_s),
        "num_relocations": device["num_relocations"],
        "relocated_bytes_scaled_up": device["relocated_bytes"] * scale,
        "relocation_s": device["relocation_s"],
    }


def measure(seed: int, steps: int, scale: int = 256) -> dict[str, Any]:
    """Figures per mode; the headline is ``eager`` (the policy compacts after evicting, as the
    manager did by default on CUDA before); ``modes.on_demand`` is reported beside it."""
    modes = {mode: _churn(seed, steps, mode, scale) for mode in MODES}
    out = dict(modes["eager"])
    out.update(compaction="eager", scale=scale, modes=modes)
    return out
