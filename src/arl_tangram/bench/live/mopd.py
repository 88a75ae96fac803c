"""Shell: the live MOPD workload of ``arl-tangram bench live`` (GPU-heavy, here on CPU devices).

Trajectories (multi-teacher on-policy distillation) each belong to one domain's teacher,
drawn with Zipf-skewed popularity over 9 locally generated teacher models of different
sizes (PAPER.md: 9 teachers, called very unevenly); after each generation chunk (think
time; no student runs) they ask the teacher for per-token log-probs of the chunk
(``logprobs`` handler). Two systems run the same seeded request stream on CPU devices (the
GPU manager's same code path) on the same cores; both are set up side by side and the
stream runs in waves of trajectories, the systems alternating ABBA, so a change of the
shared host's load hits both alike:

- ``static`` (SGLang-style): each teacher resident on its own device for the whole run,
  its memory counted at the teacher's exact footprint (the least a dedicated device holds);
  requests go straight to that replica (batched per replica, as a serving engine would).
- ``tangram``: the teachers registered with the embedded runtime, on 2 devices whose total
  memory is under a third of the static deployment's; the core swaps teachers in from host
  memory on demand and evicts idle ones (Evict-on-Execution).

Forward passes use one torch thread each in both systems, so a device is a core's worth of
compute and neither system oversubscribes the 2 cores more than the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arl_tangram.bench.live.common import LiveOptions, Progress, SystemRun, WorkloadResult
from arl_tangram.bench.live.simcheck import fit_lognormal, mean_of, platform_latency_s

NAME = "mopd"
# generated once, reused across runs (as bench gpu's models): deterministic by size and seed
CACHE_DIR = Path.home() / ".cache" / "arl-tangram" / "models"
# assumption: teacher sizes, MB of float32 weights (Llama-shaped, vocabulary 4096): a spread
# of sizes as MOPD's domain teachers have, small enough for 2 shared cores
TEACHER_BYTES = (7_800_000, 7_800_000, 9_800_000, 9_800_000, 12_000_000, 12_000_000, 14_800_000, 14_800_000, 14_800_000)
MODEL_SEED = 4200  # weights of teacher k are drawn from MODEL_SEED + k
WARM_UP_TOKENS = list(range(1, 257))  # one full-size chunk per teacher before timing (first-use costs)


@dataclass(frozen=True)
class MopdLiveParams:
    """The live workload's shape; every value is an assumption scaled to a 2-core machine
    except ``teachers`` (PAPER: 9)."""

    trajectories: int = 24  # assumption (PAPER's batch 2048, scaled down)
    teachers: int = 9  # PAPER: 9 teacher models
    zipf_s: float = 1.5  # assumption, as bench gpu's MOPD trace (PAPER: "called very unevenly")
    calls_min: int = 2  # assumption: scored chunks per trajectory, uniform in [min, max]
    calls_max: int = 4
    # generation dwarfs scoring (PAPER: ~0.6 s log-probs after minutes of generation; teacher
    # GPUs mostly idle): ~15-25x a chunk's scoring here, scaled down so a run fits a minute
    gen_mean_s: float = 1.0  # assumption: student generation before the first chunk (lognormal mean)
    gen_chunk_s: float = 0.7  # assumption: generation between later chunks
    think_sigma: float = 0.6  # assumption (sim.workloads.mopd: 0.8; shorter tails keep each wave short)
    tokens_per_call: int = 256  # assumption: one chunk of the student's sequence
    tangram_devices: int = 2  # CPU devices of the embedded runtime (each holds one teacher)
    waves: int = 6  # the batch runs in waves of trajectories, systems alternating ABBA


def live_params(opts: LiveOptions) -> MopdLiveParams:
    return MopdLiveParams(trajectories=8, calls_min=2, calls_max=3, gen_mean_s=0.6, gen_chunk_s=0.4, waves=2) if opts.quick else MopdLiveParams()


@dataclass(frozen=True)
class Plan:
    trajectory_id: str
    teacher: int
    calls: tuple[tuple[float, tuple[int, ...]], ...]  # (think before, token ids)


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def make_plans(p: MopdLiveParams, seed: int) -> list[Plan]:
    """The seeded request stream: teacher by Zipf over a seeded permutation (popularity is
    not size), then chunks of random token ids after lognormal generation times."""
    rng = random.Random(seed * 7919 + 3)
    order = list(range(p.teachers))
    rng.shuffle(order)
    weights = [1.0 / (rank + 1) ** p.zipf_s for rank in range(p.teachers)]
    plans = []
    for i in range(p.trajectories):
        teacher = rng.choices(order, weights)[0]
        calls = []
        for c in range(rng.randint(p.calls_min, p.calls_max)):
            think_s = _lognormal(rng, p.gen_mean_s if c == 0 else p.gen_chunk_s, p.think_sigma)
            calls.append((think_s, tuple(rng.randrange(4096) for _ in range(p.tokens_per_call))))
        plans.append(Plan(f"mopd-{i:03d}", teacher, tuple(calls)))
    return plans


def teacher_folders(p: MopdLiveParams) -> list[Path]:
    """Generate (or reuse from the user cache, outside the repository) the teachers;
    deterministic by size and seed."""
    from arl_tangram.managers.gpu.generated_lm import generate_causal_lm

    return [generate_causal_lm(CACHE_DIR, TEACHER_BYTES[k], seed=MODEL_SEED + k) for k in range(p.teachers)]


@dataclass
class Rec:
    teacher: int
    act_s: float
    queue_s: float
    exec_s: float
    overhead_s: float
    ok: bool


Call = Callable[[int, tuple[int, ...]], Awaitable[Rec]]


def _valid(output: Any, tokens: tuple[int, ...]) -> bool:
    """A log-prob answer: one entry per token, the first None, the rest finite and <= 0."""
    if not isinstance(output, dict) or output.get("tokens") != list(tokens):
        return False
    lps = output.get("token_logprobs") or []
    return len(lps) == len(tokens) and lps[0] is None and all(isinstance(x, float) and math.isfinite(x) and x <= 0 for x in lps[1:])


async def _drive(plans: list[Plan], call: Call, tick: Callable[[], None]) -> tuple[list[Rec], float]:
    """Run ``plans`` at once through ``call``; the records and the wave's wall time."""
    recs: list[Rec] = []

    async def trajectory(plan: Plan) -> None:
        for think_s, tokens in plan.calls:
            await asyncio.sleep(think_s)
            recs.append(await call(plan.teacher, tokens))
            tick()

    started = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for plan in plans:
            group.create_task(trajectory(plan))
    return recs, time.monotonic() - started


@contextlib.asynccontextmanager
async def _static(folders: list[Path]) -> AsyncIterator[tuple[Call, list[int]]]:
    """Every teacher resident on its own device; yields the call and each teacher's footprint."""
    from arl_tangram.managers.gpu.devices import cpu_devices
    from arl_tangram.managers.gpu.manager import GpuManager

    # arenas allocated with room to spare; the deployment is counted at each teacher's exact
    # footprint (what a device sized to it must hold), the static side's best case
    room = [2 * sum(f.stat().st_size for f in folder.glob("*.safetensors")) for folder in folders]
    gpu = GpuManager(cpu_devices(room))
    try:
        for k, folder in enumerate(folders):
            await asyncio.to_thread(gpu.register_folder, f"teacher-{k}", folder, "logprobs")
            await asyncio.to_thread(gpu.load, f"teacher-{k}", f"teacher-{k}", [k])
            await gpu.run_async(f"teacher-{k}", {"tokens": WARM_UP_TOKENS})  # warm-up, untimed

        async def call(teacher: int, tokens: tuple[int, ...]) -> Rec:
            started = time.monotonic()
            out = await gpu.run_async(f"teacher-{teacher}", {"tokens": list(tokens)})
            act_s = time.monotonic() - started
            return Rec(teacher, act_s, 0.0, act_s, 0.0, _valid(out, tokens))  # queue and exec not split

        yield call, [gpu.footprint_bytes(f"teacher-{k}", 1) for k in range(len(folders))]
    finally:
        await asyncio.to_thread(gpu.close)


@contextlib.asynccontextmanager
async def _tangram(p: MopdLiveParams, folders: list[Path], device_bytes: int) -> AsyncIterator[tuple[Call, Callable[[], dict[str, Any]]]]:
    """The teachers as services of the embedded runtime on ``tangram_devices`` CPU devices of
    ``device_bytes``; yields the call and a function reporting the swaps since the warm-up."""
    import arl_tangram
    from arl_tangram.client.transport import InProcessTransport
    from arl_tangram.runtime.config import GpuConfig, TangramConfig

    config = TangramConfig(gpu=GpuConfig(devices=p.tangram_devices, device_mem_bytes=device_bytes))
    async with arl_tangram.connect(config=config) as tg:
        for k, folder in enumerate(folders):
            await tg.register_service(f"teacher-{k}", handler="logprobs", folder=str(folder))
        for k in range(len(folders)):  # warm-up, untimed: the last teachers stay resident
            await tg.call(f"teacher-{k}", {"tokens": WARM_UP_TOKENS})
        transport = tg.transport
        assert isinstance(transport, InProcessTransport), "the embedded runtime's managers are read directly"
        gpu = transport.runtime.agent.gpu
        assert gpu is not None
        before = set(gpu.status()["replicas"])

        async def call(teacher: int, tokens: tuple[int, ...]) -> Rec:
            r = await tg.call(f"teacher-{teacher}", {"tokens": list(tokens)}, timeout_s=300.0)
            return Rec(teacher, r.act_s, r.queue_s, r.exec_s, r.overhead_s, r.ok and _valid(r.output, tokens))

        def swaps() -> dict[str, Any]:
            status = gpu.status()
            loads = [r for rid, r in status["replicas"].items() if rid not in before and r["load_s"]]
            weights = {name: s["weight_bytes"] for name, s in status["services"].items()}
            return {
                "swap_ins": len(loads), "swapped_bytes": sum(weights[r["service"]] for r in loads),
                "swap_s": sum(r["load_s"] for r in loads), "weight_bytes": weights,
                "device_bytes": sum(gpu.device_capacity_bytes()),
            }  # fmt: skip

        yield call, swaps


async def _both(p: MopdLiveParams, folders: list[Path], plans: list[Plan], tick: Callable[[], None]) -> dict[str, Any]:
    """Both systems set up side by side, the stream in waves run in ABBA order (static,
    tangram, tangram, static, ...), so a change of the shared host's load hits both alike."""
    recs: dict[str, list[Rec]] = {"static": [], "tangram": []}
    step_s = {"static": 0.0, "tangram": 0.0}
    size = math.ceil(len(plans) / p.waves)
    waves = [plans[i : i + size] for i in range(0, len(plans), size)]
    async with _static(folders) as (static_call, footprints), _tangram(p, folders, max(footprints)) as (tangram_call, swaps):
        calls = {"static": static_call, "tangram": tangram_call}
        for i, wave in enumerate(waves):
            for system in ("static", "tangram") if i % 2 == 0 else ("tangram", "static"):
                wave_recs, wave_s = await _drive(wave, calls[system], tick)
                recs[system] += wave_recs
                step_s[system] += wave_s
        swap = swaps()
    return {"recs": recs, "step_s": step_s, "footprints": footprints, "swap": swap}


def _system_run(system: str, recs: list[Rec], step_s: float, device_bytes: int) -> SystemRun:
    return SystemRun(
        system, [r.act_s for r in recs], [r.queue_s for r in recs], [r.exec_s for r in recs],
        [r.overhead_s for r in recs], step_s, device_bytes=device_bytes,
    )  # fmt: skip


def _quantile_ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(static: SystemRun, tangram: SystemRun, swap: dict[str, Any], recs: dict[str, list[Rec]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "tangram_p50_ms": 1e3 * statistics.median(tangram.act_s),
        "static_p50_ms": 1e3 * statistics.median(static.act_s),
        "tangram_p99_ms": _quantile_ms(tangram.act_s, 0.99),
        "static_p99_ms": _quantile_ms(static.act_s, 0.99),
        "tangram_device_bytes": tangram.device_bytes,
        "static_device_bytes": static.device_bytes,
        "swap_ins": swap["swap_ins"],
        "requests": len(tangram.act_s),
        "requests_per_teacher": [sum(1 for r in recs["tangram"] if r.teacher == k) for k in range(len(swap["weight_bytes"]))],
    }
    summary["device_bytes_ratio"] = tangram.device_bytes / static.device_bytes
    summary["p50_ratio"] = summary["tangram_p50_ms"] / summary["static_p50_ms"]
    for system in ("static", "tangram"):
        summary[f"{system}_failed_actions"] = sum(not r.ok for r in recs[system])
    return summary


def _fit(p: MopdLiveParams, recs: list[Rec], swap: dict[str, Any], device_bytes: int) -> dict[str, Any]:
    """MopdParams-shaped distribution parameters of the tangram run (the plan's shape, the
    measured log-prob service time and its spread) plus this machine's GPU side."""
    exec_mean_s, exec_sigma = fit_lognormal([r.exec_s for r in recs if r.ok])
    latency_s = platform_latency_s([r.queue_s for r in recs], [r.overhead_s for r in recs])
    gbps = swap["swapped_bytes"] / swap["swap_s"] / 1e9 if swap["swap_s"] > 0 else 25.0
    return {
        "batch": math.ceil(p.trajectories / p.waves), "teachers": p.teachers, "devices_per_teacher": 1, "zipf_s": p.zipf_s,
        "calls_min": p.calls_min, "calls_max": p.calls_max, "gen_mean_s": p.gen_mean_s,
        "gen_chunk_s": p.gen_chunk_s, "think_sigma": p.think_sigma, "logprob_s_at_4": exec_mean_s + latency_s,
        "teacher_weight_bytes": int(mean_of(list(swap["weight_bytes"].values()))), "sigma": exec_sigma,
        "gpu_devices": p.tangram_devices, "device_mem_bytes": device_bytes, "host_to_device_gbps": gbps,
        "platform_latency_s": latency_s, "exec_mean_s": exec_mean_s,
    }  # fmt: skip


def run(opts: LiveOptions, progress: Progress) -> WorkloadResult:
    """Both systems on the same seeded stream (static's footprints size tangram's devices).
    Every request must come back with valid log-probs."""
    import torch

    p = live_params(opts)
    plans = make_plans(p, opts.seed)
    progress.start(NAME, 2 * sum(len(plan.calls) for plan in plans))
    progress.note(NAME, f"generating {p.teachers} teachers in {CACHE_DIR} (cached)")
    folders = teacher_folders(p)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        progress.note(NAME, f"static: one device per teacher; tangram: {p.tangram_devices} devices; {p.waves} waves ABBA")
        out = asyncio.run(_both(p, folders, plans, lambda: progress.advance(NAME)))
    finally:
        torch.set_num_threads(threads)
    swap, recs = out["swap"], out["recs"]
    static = _system_run("static", recs["static"], out["step_s"]["static"], sum(out["footprints"]))
    tangram = _system_run("tangram", recs["tangram"], out["step_s"]["tangram"], swap["device_bytes"])
    tangram.extra.update(swap_ins=float(swap["swap_ins"]), swap_s=float(swap["swap_s"]))
    summary = _summary(static, tangram, swap, recs)
    return WorkloadResult(NAME, [tangram, static], summary, _fit(p, recs["tangram"], swap, max(out["footprints"])))
