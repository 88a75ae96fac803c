"""Shell: ``arl-tangram bench gpu [--json]``: live figures of the GPU manager (Evict-on-Execution).

Measures, on CUDA when torch sees it and on a CPU device with a memory budget otherwise:
- ``raw_copy_gbps``: one plain host -> device copy of a buffer the size of the model into a
  preallocated device buffer (pinned source on CUDA): the physical limit of a swap-in;
- ``swap_in_gbps`` / ``swap_in_s``: the manager's real swap-in path for the same model
  (reserve an extent, copy, bind the replica's module), timed around ``GpuManager.load``;
- ``swap_efficiency`` (with ``_p25``/``_p75``): median over interleaved rounds of raw copy
  seconds / swap-in seconds, each swap-in against the raw copies around it (``gpu_swap``);
- ``cold_load_s``: build the module and load its safetensors from disk (the files dropped from
  the page cache first), weights materialised on the device (``from_pretrained`` + ``.to``);
- ``fragmentation_largest_free_extent_ratio``: largest free extent / total free bytes during a
  load/evict churn that drives the real manager with realistic model shapes, scaled down
  (``gpu_fragmentation``); ``fragmentation_largest_free_ratio`` is kept as the same figure
  (there are no buddy blocks any more: extents are exact);
- ``loop_stall_p99_ms`` and ``resident_call_slowdown_during_swaps`` (``gpu_stall``);
- ``resident_call_p50_ms_quiet`` / ``_churn`` and ``resident_call_churn_ratio``: the same
  resident calls through ``StandaloneGpuManager`` while it swaps two others (``gpu_standalone``);
- ``mopd``: 9 generated teachers under a skewed trace; static = every teacher resident in its
  own memory (never swaps), tangram = one budget that holds 3 teachers, with the standalone
  wrapper's LRU Evict-on-Execution;
- ``generate``: a generated chat LM of ``--generate-mb`` decoding 16 concurrent requests in
  one continuous batch against the same requests one at a time (``gpu_generate``).
``--only generate`` measures that part alone. Progress goes to stderr; ``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from arl_tangram.bench import gpu_fragmentation, gpu_generate, gpu_stall, gpu_standalone, gpu_swap

ASSUMPTIONS = {
    "mopd_trace": "closed loop, one request at a time; teacher drawn from Zipf(s) over a seeded "
    "permutation of the 9 teachers (a few hot, most rarely called); student sequence of "
    "--mopd-tokens random token ids per request. Not a published trace: our assumption.",
    "static": "each teacher resident in its own arena sized to it (no swaps), bytes = sum",
    "tangram": "one arena sized to hold 3 teachers at once, LRU Evict-on-Execution",
    "swap_efficiency": "raw copy and swap-in of the same bytes interleaved (raw, swap, raw, ...) "
    f"for --swap-rounds after {gpu_swap.WARMUP_ROUNDS} warm-up rounds; per round, the mean of the "
    "raw copies just before and after / the swap-in; median, p25 and p75 over rounds",
    "cold_load": "the model's files are dropped from the page cache (posix_fadvise DONTNEED) before "
    "each timed load; cold_load_page_cache_s is the same load with the files cached",
    "fragmentation": "bf16 Qwen2.5-shaped models 0.5B-14B plus MiniLM-sized rewards on an 80 GiB "
    "arena with 2 MiB granules, scaled down by fragmentation.scale, on the real manager; "
    "Zipf(1.1) popularity, the bench evicts LRU replicas until the free bytes suffice; mean over "
    "churn steps. Headline = 'eager' (the policy compacts after evicting); on_demand beside it",
    "loop_stall": "10-ms asyncio heartbeat while a thread alternates two --swap-mb services that "
    "cannot both be resident; a small resident teacher called with run_async every 20 ms. The "
    "churn runs in 1-s windows alternating with 1-s windows without it (--stall-s of each); every "
    "heartbeat and call is classed by whether it overlapped a swap, so both sides see the same "
    "drift of the host's load",
    "generate": f"{gpu_generate.NUM_CONCURRENT} concurrent greedy requests of exactly {gpu_generate.NEW_TOKENS} new "
    "tokens (EOS masked) on prompts of 24-40 tokens; serial = --generate-serial of the same requests one at "
    "a time; ttft from each request's submission; cold start = evict, load, first token, median of 10",
}


def _log(message: str) -> None:
    print(f"[bench gpu] {message}", file=sys.stderr, flush=True)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="arl-tangram bench gpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--model-mb", type=float, default=256, help="size of the swap/cold-load model"
    )
    parser.add_argument("--teacher-mb", type=float, default=24, help="size of each MOPD teacher")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--repeats", type=int, default=5, help="repeats of each timed cold load (at most 3)"
    )
    parser.add_argument(
        "--swap-rounds",
        type=int,
        default=20,
        help="interleaved raw-copy/swap-in rounds timed for swap_efficiency",
    )
    parser.add_argument("--mopd-requests", type=int, default=300)
    parser.add_argument("--mopd-tokens", type=int, default=128)
    parser.add_argument("--zipf", type=float, default=1.5, help="skew of the MOPD trace")
    parser.add_argument("--churn-steps", type=int, default=1500)
    parser.add_argument("--churn-scale", type=int, default=256, help="size divisor of the churn")
    parser.add_argument(
        "--swap-mb", type=float, default=1024, help="size of each stall-test service"
    )
    parser.add_argument(
        "--stall-s", type=float, default=10.0, help="churn seconds of the stall test"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generate-mb", type=float, default=256, help="generated chat LM (fp32: 64 M parameters)")
    parser.add_argument("--generate-serial", type=int, default=4, help="requests timed one after another")
    parser.add_argument("--only", choices=["generate"], default=None, help="measure one part alone")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: 1 on CPU devices: on a small shared VM two spinning "
        "OpenMP threads stall each other for hundreds of ms; torch's default on CUDA)",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="use a CPU device even if CUDA is present"
    )
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(os.path.expanduser("~"), ".cache", "arl-tangram", "models"),
    )
    return parser.parse_args(argv)


def _median_s(repeats: int, run: Callable[[], float]) -> float:
    run()  # warm-up: first touch, lazy inits
    return statistics.median(run() for _ in range(repeats))


def _device_spec(args: argparse.Namespace, name: str, budget_bytes: int) -> Any:
    from arl_tangram.managers.gpu.devices import DeviceSpec, cuda_available

    if cuda_available() and not args.cpu:
        import torch

        index = int(name.removeprefix("dev")) % torch.cuda.device_count()  # spread over GPUs
        return DeviceSpec(
            name.replace("dev", "cuda:"), f"cuda:{index}", "cuda", budget_bytes, "cuda"
        )
    return DeviceSpec(name.replace("dev", "cpu:"), "cpu", "cpu", budget_bytes, "host memory arena")


def _drop_file_cache(folder: Path) -> bool:
    """Evict only this model's files from the page cache, so the next read comes from disk.

    ``False`` where the kernel refuses (some sandboxes lack ``fadvise``): the "cold" load is
    then a page-cache load, and the result says so (``cold_load_cache_dropped``).
    """
    dropped = True
    for path in folder.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            dropped = False
        finally:
            os.close(fd)
    return dropped


def _cold_loader(torch: Any, device: Any, folder: Path, drop_cache: bool) -> Callable[[], float]:
    """Build the module from disk and materialise its weights in device memory; returns seconds.

    ``from_pretrained`` memory-maps safetensors lazily, so every tensor is copied to the
    device (``.to`` on CUDA; a fresh copy on CPU): the service is usable only after that.
    """
    from arl_tangram.managers.gpu.models import load_folder

    def cold() -> float:
        if drop_cache:
            _drop_file_cache(folder)
        started = time.perf_counter()
        module = load_folder(folder, "logprobs").module.to(device)
        if device.type == "cpu":
            for tensor in list(module.parameters()) + list(module.buffers()):
                tensor.data = tensor.data.clone()
        gpu_swap.sync(torch, device)
        elapsed = time.perf_counter() - started
        del module
        return elapsed

    return cold


def measure_copy_swap_cold(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    import torch

    from arl_tangram.managers.gpu.models import load_folder

    probe = load_folder(folder, "logprobs")
    payload = sum(
        t.numel() * t.element_size()
        for t in list(probe.module.parameters()) + list(probe.module.buffers())
    )
    del probe
    spec = _device_spec(args, "dev0", int(payload * 1.25) + (8 << 20))
    device = torch.device(spec.torch_device)
    swap = gpu_swap.measure(spec, folder, payload, args.swap_rounds)
    swap_s = swap["swap_in_s"]
    _log(
        f"{payload / 1e6:.0f} MB: raw copy {swap['raw_copy_s'] * 1e3:.2f} ms, swap-in "
        f"{swap_s * 1e3:.2f} ms; efficiency {swap['swap_efficiency']:.3f} (p25 "
        f"{swap['swap_efficiency_p25']:.3f}, p75 {swap['swap_efficiency_p75']:.3f}, "
        f"{swap['swap_efficiency_rounds']} rounds)"
    )
    cold_s = _median_s(max(1, min(args.repeats, 3)), _cold_loader(torch, device, folder, True))
    warm_s = _median_s(max(1, min(args.repeats, 3)), _cold_loader(torch, device, folder, False))
    dropped = _drop_file_cache(folder)
    _log(f"cold load: {cold_s:.3f} s from disk, {warm_s:.3f} s from the page cache")
    return {
        "model_bytes": payload,
        **swap,
        "cold_load_s": cold_s,
        "cold_load_cache_dropped": dropped,
        "cold_load_page_cache_s": warm_s,
        "swap_vs_cold": cold_s / swap_s,
        "swap_vs_cold_page_cache": warm_s / swap_s,
    }


def measure_fragmentation(args: argparse.Namespace) -> dict[str, Any]:
    """Churn on the real manager under each mode (``gpu_fragmentation``)."""
    out = gpu_fragmentation.measure(args.seed, args.churn_steps, args.churn_scale)
    ratios = {m: round(f["largest_free_extent_ratio"], 3) for m, f in out["modes"].items()}
    _log(f"fragmentation (largest free extent / free): {json.dumps(ratios)}")
    return out


def _trace(args: argparse.Namespace, num_teachers: int) -> list[tuple[int, list[int]]]:
    rng = random.Random(args.seed)
    order = list(range(num_teachers))
    rng.shuffle(order)
    weights = [1 / (rank + 1) ** args.zipf for rank in range(num_teachers)]
    picks = rng.choices(order, weights, k=args.mopd_requests)
    return [(t, [rng.randrange(4096) for _ in range(args.mopd_tokens)]) for t in picks]


def _run_trace(manager: Any, trace: list[tuple[int, list[int]]]) -> list[float]:
    """Closed loop through the standalone wrapper (it places and evicts by LRU)."""
    latencies = []
    for teacher, tokens in trace:
        started = time.perf_counter()
        manager.call_sync(f"teacher{teacher}", {"tokens": tokens})
        latencies.append((time.perf_counter() - started) * 1e3)
    return latencies


def measure_mopd(args: argparse.Namespace, cache: Path) -> dict[str, Any]:
    from arl_tangram.managers.gpu import GpuManager, StandaloneGpuManager
    from arl_tangram.managers.gpu.generated_lm import generate_causal_lm

    folders = [
        generate_causal_lm(cache, int(args.teacher_mb * 1e6), seed=100 + i, dtype=args.dtype)
        for i in range(9)
    ]
    with GpuManager([_device_spec(args, "dev0", 1 << 30)]) as probe:
        for i, folder in enumerate(folders):
            probe.register_folder(f"p{i}", folder, "logprobs")
        footprint = max(probe.footprint_bytes(f"p{i}", 1) for i in range(len(folders)))
    trace = _trace(args, len(folders))
    setups = {
        "static": [_device_spec(args, f"dev{i}", footprint) for i in range(len(folders))],
        "tangram": [_device_spec(args, "dev0", 3 * footprint)],
    }
    out: dict[str, Any] = {}
    for label, specs in setups.items():
        with StandaloneGpuManager(specs) as manager:
            for i, folder in enumerate(folders):
                manager.register_folder(f"teacher{i}", folder, "logprobs")
            for i in range(len(folders)):  # deployment warm-up, not timed
                manager.call_sync(f"teacher{i}", {"tokens": [1, 2, 3]})
            before = sum(manager.num_loads.values())
            latencies = _run_trace(manager, trace)
            swaps = sum(manager.num_loads.values()) - before
            out[f"{label}_p50_ms"] = statistics.median(latencies)
            out[f"{label}_p90_ms"] = statistics.quantiles(latencies, n=10)[-1]
            out[f"{label}_mean_ms"] = statistics.fmean(latencies)
            out[f"{label}_device_bytes"] = sum(spec.mem_bytes for spec in specs)
            out[f"{label}_swap_ins"] = swaps
        _log(f"mopd {label}: p50 {out[f'{label}_p50_ms']:.2f} ms, {swaps} swap-ins")
    counts = [sum(1 for t, _ in trace if t == i) for i in range(len(folders))]
    out.update(
        num_teachers=len(folders),
        teacher_bytes=footprint,
        requests=len(trace),
        requests_per_teacher=counts,
    )
    return out


def _targets(result: dict[str, Any]) -> dict[str, bool]:
    generate = result.get("generate")
    targets = {} if generate is None else {
        "generate_batch_speedup>=4": generate["batch_speedup"] >= 4,
        "generate_matches_reference": bool(generate["matches_reference"]),
    }  # fmt: skip
    if "mopd" not in result:
        return targets
    mopd = result["mopd"]
    return targets | {
        "swap_efficiency>=0.8": result["swap_efficiency"] >= 0.8,
        "swap_vs_cold>=10": result["swap_vs_cold"] >= 10,
        "fragmentation_extent>=0.9": result["fragmentation_largest_free_extent_ratio"] >= 0.9,
        "loop_stall_p99_ms<=5": result["loop_stall_p99_ms"] <= 5,
        "resident_call_slowdown<=1.5": result["resident_call_slowdown_during_swaps"] <= 1.5,
        "resident_call_churn_ratio<=1.5": result["resident_call_churn_ratio"] <= 1.5,
        "tangram_bytes<=static/3": mopd["tangram_device_bytes"] * 3 <= mopd["static_device_bytes"],
        "tangram_p50<=1.25*static_p50": mopd["tangram_p50_ms"] <= 1.25 * mopd["static_p50_ms"],
    }


def _print_table(result: dict[str, Any]) -> None:
    if "mopd" not in result:
        for key, value in sorted(result.get("generate", {}).items()):
            print(f"generate.{key:<28}  {value}")
        return
    mopd = result["mopd"]
    rows = [
        ("device", result["device"]),
        ("model bytes", f"{result['model_bytes'] / 1e6:.1f} MB"),
        ("raw copy", f"{result['raw_copy_gbps']:.2f} GB/s"),
        ("swap-in", f"{result['swap_in_gbps']:.2f} GB/s ({result['swap_in_s'] * 1e3:.2f} ms)"),
        (
            "swap efficiency",
            f"{result['swap_efficiency']:.3f} (p25 {result['swap_efficiency_p25']:.3f}, "
            f"p75 {result['swap_efficiency_p75']:.3f}, {result['swap_efficiency_rounds']} rounds)",
        ),
        ("cold load", f"{result['cold_load_s']:.3f} s"),
        ("swap vs cold", f"{result['swap_vs_cold']:.1f}x"),
        (
            "fragmentation",
            f"{result['fragmentation_largest_free_extent_ratio']:.3f} (largest free extent / free)",
        ),
        ("loop stall p99", f"{result['loop_stall_p99_ms']:.2f} ms"),
        ("resident call slowdown", f"{result['resident_call_slowdown_during_swaps']:.2f}x"),
        ("standalone resident call", f"p50 {result['resident_call_p50_ms_quiet']:.2f} ms quiet, "
         f"{result['resident_call_p50_ms_churn']:.2f} ms churn ({result['resident_call_churn_ratio']:.2f}x)"),
        (
            "mopd static",
            f"p50 {mopd['static_p50_ms']:.2f} ms, {mopd['static_device_bytes'] / 1e6:.1f} MB",
        ),
        (
            "mopd tangram",
            f"p50 {mopd['tangram_p50_ms']:.2f} ms, {mopd['tangram_device_bytes'] / 1e6:.1f} MB",
        ),
    ]
    rows += [(f"target {k}", "met" if ok else "MISSED") for k, ok in result["targets"].items()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


@contextlib.contextmanager
def _timed(phase_s: dict[str, float], name: str) -> Iterator[None]:
    """Seconds of each phase (``phase_s`` in the JSON): where a run's budget went."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phase_s[name] = round(time.perf_counter() - started, 2)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from arl_tangram.managers.gpu.devices import cuda_available

    on_cuda = cuda_available() and not args.cpu
    threads = args.torch_threads or (None if on_cuda else 1)
    if threads:
        torch.set_num_threads(threads)
    device = (
        f"cuda:0 ({torch.cuda.get_device_name(0)})"
        if on_cuda
        else f"cpu ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})"
    )
    cache = Path(args.cache_dir)
    _log(f"device {device}; generating models in {cache} (cached)")
    started = time.perf_counter()
    phase_s: dict[str, float] = {}
    # figures on a shared host: say how shared (1-minute load average at start and end)
    loadavg = [os.getloadavg()[0]]
    result: dict[str, Any] = {"device": device, "phase_s": phase_s, "host_loadavg_1m": loadavg}
    if args.only != "generate":
        _measure_managers(args, cache, phase_s, result)
    _log(f"generate: a {args.generate_mb:.0f} MB chat LM, {gpu_generate.NUM_CONCURRENT} concurrent requests")
    with _timed(phase_s, "generate_decode"):
        spec = lambda name, budget: _device_spec(args, name, budget)  # noqa: E731
        result["generate"] = gpu_generate.measure(spec, cache, int(args.generate_mb * 1e6), args.generate_serial, log=_log)
    result["targets"] = _targets(result)
    result["assumptions"] = ASSUMPTIONS
    loadavg.append(os.getloadavg()[0])
    result["elapsed_s"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


def _measure_managers(args: argparse.Namespace, cache: Path, phase_s: dict[str, float], result: dict[str, Any]) -> None:
    """Every figure but ``generate`` (see the module docstring)."""
    from arl_tangram.managers.gpu.generated_lm import generate_causal_lm

    with _timed(phase_s, "generate"):
        folder = generate_causal_lm(
            cache, int(args.model_mb * 1e6), seed=args.seed, dtype=args.dtype
        )
        small = generate_causal_lm(cache, int(args.teacher_mb * 1e6), seed=100, dtype=args.dtype)
    with _timed(phase_s, "copy_swap_cold"):
        result.update(measure_copy_swap_cold(args, folder))
    _log("fragmentation churn")
    with _timed(phase_s, "fragmentation"):
        fragmentation = measure_fragmentation(args)
    result["fragmentation_largest_free_extent_ratio"] = fragmentation["largest_free_extent_ratio"]
    result["fragmentation_largest_free_ratio"] = fragmentation["largest_free_extent_ratio"]
    result["fragmentation"] = fragmentation
    _log(f"loop stall: two {args.swap_mb:.0f} MB services alternating for {args.stall_s:.0f} s")
    with _timed(phase_s, "loop_stall"):
        stall = gpu_stall.measure(
            _device_spec(args, "dev0", 1 << 30), small, int(args.swap_mb * 1e6), args.stall_s
        )
    _log(
        f"loop stall p99 {stall['loop_stall_p99_ms']:.2f} ms during swaps, "
        f"{stall['loop_stall_p99_ms_without_swaps']:.2f} ms without; "
        f"slowdown {stall['resident_call_slowdown_during_swaps']:.2f}"
    )
    result.update(
        {k: stall[k] for k in ("loop_stall_p99_ms", "resident_call_slowdown_during_swaps")}
    )
    result["loop_stall"] = stall
    _log("standalone wrapper: a resident service's calls while two others swap")
    with _timed(phase_s, "standalone_churn"):
        churn = gpu_standalone.measure(
            _device_spec(args, "dev0", 1 << 30), small, int(args.swap_mb * 1e6), max(1.0, args.stall_s / 2)
        )
    result.update({k: v for k, v in churn.items() if k.startswith("resident_call_")})
    result["standalone_churn"] = churn
    _log("mopd: 9 teachers")
    with _timed(phase_s, "mopd"):
        result["mopd"] = measure_mopd(args, cache)
