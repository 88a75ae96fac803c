"""Shell: the live DeepSearch workload of ``arl-tangram bench live`` (API-heavy).

Trajectories alternate generation (think time; no LLM runs) with queries to a local search
provider (``search_service``: SQLite FTS5 over the HumanEval prompts, in its own process,
enforcing its own rate limit with 429s), then a judge model scores the top hit against the
question: MiniLM ``score`` by default, or with ``--judge generative`` an LLM-as-a-judge (a
generated causal LM behind the ``generate`` handler, ``judges.py``). Two systems run the same seeded request stream, each against
a fresh provider with the same limit:

- ``tangram``: the provider in ``[[providers]]`` at its real rate; calls go through
  ``tg.call("api/search", ...)`` so the quota manager paces them; the judge is a service
  of the embedded runtime on one CPU device (Evict-on-Execution).
- ``semaphore``: what frameworks do today: the same calls guarded only by a client-side
  ``asyncio.Semaphore``, retried on 429 as the openai-python client does; the judge is a
  static deployment (the same model resident on one CPU device of the same size).

``leaked_429`` counts 429s that reached trajectory code; ``quota_violations`` counts what
the provider received above its limit, counted by the provider.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from arl_tangram.bench.live.common import LiveOptions, Progress, SystemRun, WorkloadResult
from arl_tangram.bench.live.judges import JudgeModel, judge_model
from arl_tangram.bench.live.search_service import (
    SearchService,
    ServiceSettings,
    build_corpus,
    corpus_documents,
    keywords,
)
from arl_tangram.bench.live.simcheck import fit_lognormal, mean_of, platform_latency_s

NAME = "deepsearch"
JUDGE_DEVICE_BYTES = 256 << 20  # one CPU device for the judge in both systems (MiniLM: ~90 MB fp32)


@dataclass(frozen=True)
class DeepSearchLiveParams:
    """The live workload's shape. Each value is an assumption scaled to a 2-core machine
    (PAPER.md publishes no DeepSearch trace; PAPER: "search-API limits far below batch ×
    group size", so the offered rate is set above the provider's limit)."""

    trajectories: int = 48  # assumption (PAPER's batch 2048, scaled down)
    calls_min: int = 2  # assumption: search calls per trajectory, uniform in [min, max]
    calls_max: int = 5
    think_mean_s: float = 1.0  # assumption: generation between calls, lognormal mean
    think_sigma: float = 0.6  # assumption (as sim.workloads.deepsearch)
    rate_per_s: float = 10.0  # assumption: the provider's limit, requests/s for the whole provider
    burst: float = 4.0  # assumption: the provider's bucket depth (requests accepted at once)
    latency_s: float = 0.05  # assumption: a search's service time at the provider
    # [[providers]]: the burst is half the provider's, as an operator leaves headroom, so that
    # 200 ms of scheduling jitter on a loaded 2-core host never crosses the provider's limit;
    # max_concurrency equals it, since the core's quota bucket holds max_concurrency tokens
    # (a deeper core bucket would only move the wait into the manager's own pacing)
    tangram_burst: float = 2.0
    tangram_concurrency: int = 2
    semaphore: int = 8  # assumption: a framework's client-side concurrency limit
    # openai-python's retry policy (assumption: the typical client): honour Retry-After up
    # to 60 s, else min(0.5 * 2**n, 8) s less up to 25% jitter; more retries than its
    # default 2 so that every request is answered in the end
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 8.0
    max_retries: int = 20


def live_params(opts: LiveOptions) -> DeepSearchLiveParams:
    return DeepSearchLiveParams(trajectories=16, calls_min=2, calls_max=3) if opts.quick else DeepSearchLiveParams()


@dataclass(frozen=True)
class Plan:
    """One trajectory: its question, (think before, query) per search, think before the judge."""

    trajectory_id: str
    question: str
    searches: tuple[tuple[float, str], ...]
    judge_think_s: float


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def _docstring(prompt: str) -> str:
    parts = prompt.split('"""') if '"""' in prompt else prompt.split("'''")
    return " ".join((parts[1] if len(parts) > 2 else prompt).split())


def make_plans(p: DeepSearchLiveParams, seed: int) -> list[Plan]:
    """The seeded request stream both systems run: a HumanEval problem's docstring is the
    question; each query is three of its keywords."""
    rng = random.Random(seed * 7919 + 12)
    docs = corpus_documents()
    plans = []
    for i in range(p.trajectories):
        question = _docstring(docs[rng.randrange(len(docs))][1])
        words = keywords(question) or ["list"]
        searches = tuple(
            (_lognormal(rng, p.think_mean_s, p.think_sigma), " ".join(rng.choice(words) for _ in range(3)))
            for _ in range(rng.randint(p.calls_min, p.calls_max))
        )  # fmt: skip
        plans.append(Plan(f"ds-{i:03d}", question[:400], searches, _lognormal(rng, p.think_mean_s, p.think_sigma)))
    return plans


@dataclass
class Rec:
    kind: str  # search | judge
    act_s: float
    queue_s: float
    exec_s: float
    overhead_s: float
    ok: bool
    leaked_429: int = 0


Search = Callable[[str], Awaitable[tuple[Rec, dict[str, Any]]]]
Judge = Callable[[str, str], Awaitable[tuple[Rec, float]]]


async def _trajectory(plan: Plan, search: Search, judge: Judge, recs: list[Rec], rewards: list[float], tick: Callable[[], None]) -> None:
    answer = ""
    for think_s, query in plan.searches:
        await asyncio.sleep(think_s)
        rec, body = await search(query)
        recs.append(rec)
        tick()
        hits = body.get("hits") or []
        answer = str(hits[0]["snippet"]) if hits else answer
    await asyncio.sleep(plan.judge_think_s)
    rec, score = await judge(answer or "no answer", plan.question)
    recs.append(rec)
    rewards.append(score)
    tick()


async def _drive(system: str, plans: list[Plan], search: Search, judge: Judge, tick: Callable[[], None]) -> tuple[SystemRun, list[Rec], list[float]]:
    recs: list[Rec] = []
    rewards: list[float] = []
    started = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for plan in plans:
            group.create_task(_trajectory(plan, search, judge, recs, rewards, tick))
    step_s = time.monotonic() - started
    run = SystemRun(
        system, [r.act_s for r in recs], [r.queue_s for r in recs], [r.exec_s for r in recs],
        [r.overhead_s for r in recs], step_s, leaked_429=sum(r.leaked_429 for r in recs),
    )  # fmt: skip
    return run, recs, rewards


async def _run_tangram(
    p: DeepSearchLiveParams, plans: list[Plan], svc: SearchService, tick: Callable[[], None], start: asyncio.Barrier,
    jm: JudgeModel,
) -> tuple[SystemRun, list[Rec], list[float]]:  # fmt: skip
    import arl_tangram
    from arl_tangram.managers.api.config import ProviderConfig
    from arl_tangram.runtime.config import GpuConfig, TangramConfig

    provider = ProviderConfig(
        "search", svc.base_url, (svc.settings.key,), rate_per_s=p.rate_per_s, max_concurrency=p.tangram_concurrency, burst=p.tangram_burst,
    )  # fmt: skip
    config = TangramConfig(gpu=GpuConfig(devices=1, device_mem_bytes=JUDGE_DEVICE_BYTES), providers=(provider,))
    await start.wait()  # the baseline's judge loaded first: transformers' first import is not thread-safe
    async with arl_tangram.connect(config=config) as tg:
        await tg.register_service(
            jm.name, handler=jm.handler, folder=str(jm.folder), max_batch=jm.max_batch, max_context_tokens=jm.max_context_tokens,
        )  # fmt: skip

        async def search(query: str) -> tuple[Rec, dict[str, Any]]:
            r = await tg.call("api/search", {"q": query, "k": 5}, path="/search", timeout_s=300.0)
            body = r.output if r.ok and isinstance(r.output, dict) else {}
            leaked = int(r.exit_code == 429)  # a 429 the manager gave up on reaches the trajectory
            return Rec("search", r.act_s, r.queue_s, r.exec_s, r.overhead_s, r.ok, leaked), body

        async def judge(answer: str, question: str) -> tuple[Rec, float]:
            r = await tg.call(jm.name, jm.request(answer, question))
            score = jm.score(r.output) if r.ok else float("nan")
            return Rec("judge", r.act_s, r.queue_s, r.exec_s, r.overhead_s, r.ok), score

        await start.wait()  # both systems set up: the two streams start together
        return await _drive("tangram", plans, search, judge, tick)


def _backoff_s(p: DeepSearchLiveParams, response: httpx.Response, attempt: int, rng: random.Random) -> float:
    """The wait before retry ``attempt + 1`` after a 429, as openai-python computes it."""
    header = response.headers.get("retry-after")
    try:
        after_s = float(header) if header is not None else None
    except ValueError:
        after_s = None
    if after_s is not None and 0 < after_s <= 60:
        return after_s
    return min(p.backoff_base_s * 2**attempt, p.backoff_cap_s) * (1 - 0.25 * rng.random())


async def _run_semaphore(
    p: DeepSearchLiveParams, plans: list[Plan], svc: SearchService, seed: int, tick: Callable[[], None], start: asyncio.Barrier,
    jm: JudgeModel,
) -> tuple[SystemRun, list[Rec], list[float]]:  # fmt: skip
    from arl_tangram.managers.gpu.devices import cpu_devices
    from arl_tangram.managers.gpu.manager import GpuManager

    sem = asyncio.Semaphore(p.semaphore)
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {svc.settings.key}"}
    gpu = GpuManager(cpu_devices([JUDGE_DEVICE_BYTES]))
    try:
        await asyncio.to_thread(gpu.register_folder, jm.name, jm.folder, jm.handler, jm.kv())
        await asyncio.to_thread(gpu.load, jm.name, jm.name, [0])  # the static deployment is up before the step
        await start.wait()  # lets tangram set up
        async with httpx.AsyncClient(base_url=svc.base_url, timeout=60.0) as client:

            async def search(query: str) -> tuple[Rec, dict[str, Any]]:
                submitted = time.monotonic()
                async with sem:
                    queue_s = time.monotonic() - submitted
                    leaked = 0
                    for attempt in range(p.max_retries + 1):
                        sent = time.monotonic()
                        response = await client.post("/search", json={"q": query, "k": 5}, headers=headers)
                        if response.status_code != 429:
                            break
                        leaked += 1  # the trajectory's own code sees the 429 and must retry
                        if attempt < p.max_retries:
                            await asyncio.sleep(_backoff_s(p, response, attempt, rng))
                    exec_s = time.monotonic() - sent
                act_s = time.monotonic() - submitted
                ok = response.is_success
                return Rec("search", act_s, queue_s, exec_s, act_s - queue_s - exec_s, ok, leaked), response.json() if ok else {}

            async def judge(answer: str, question: str) -> tuple[Rec, float]:
                started = time.monotonic()
                out = await gpu.run_async(jm.name, jm.request(answer, question))
                act_s = time.monotonic() - started
                return Rec("judge", act_s, 0.0, act_s, 0.0, True), jm.score(out)

            await start.wait()
            return await _drive("semaphore", plans, search, judge, tick)
    finally:
        await asyncio.to_thread(gpu.close)


def _summarise(runs: dict[str, tuple[SystemRun, list[Rec], list[float]]], stats: dict[str, dict[str, int]]) -> dict[str, Any]:
    tangram, base = runs["tangram"][0], runs["semaphore"][0]
    summary: dict[str, Any] = {
        "act_gain": base.mean_act_s / tangram.mean_act_s if tangram.mean_act_s > 0 else float("nan"),
        "leaked_429": tangram.leaked_429,
        "quota_violations": stats["tangram"]["violations"],
        "baseline_leaked_429": base.leaked_429,
        "baseline_quota_violations": stats["semaphore"]["violations"],
        "step_gain": base.step_s / tangram.step_s if tangram.step_s > 0 else float("nan"),
    }
    for system, (run, recs, rewards) in runs.items():
        searches = [r.act_s for r in recs if r.kind == "search"]
        summary[f"{system}_mean_act_s"] = run.mean_act_s
        summary[f"{system}_search_mean_act_s"] = mean_of(searches)
        summary[f"{system}_failed_actions"] = sum(not r.ok for r in recs)
        summary[f"{system}_actions"] = len(recs)
        summary[f"{system}_mean_reward"] = mean_of([x for x in rewards if math.isfinite(x)])
        summary[f"{system}_provider_accepted"] = stats[system]["accepted"]
    summary["search_act_gain"] = summary["semaphore_search_mean_act_s"] / summary["tangram_search_mean_act_s"]
    return summary


def _fit(p: DeepSearchLiveParams, recs: list[Rec], jm: JudgeModel) -> dict[str, Any]:
    """DeepSearchParams-shaped distribution parameters of the tangram run: the plan's
    parameters plus the measured service times (means and log-space spreads)."""
    search_mean_s, search_sigma = fit_lognormal([r.exec_s for r in recs if r.kind == "search" and r.ok])
    judge_mean_s, _ = fit_lognormal([r.exec_s for r in recs if r.kind == "judge" and r.ok])
    # the judge calls wait for no quota: their fastest fifth shows the platform's own latency
    judges = [r for r in recs if r.kind == "judge"]
    latency_s = platform_latency_s([r.queue_s for r in judges], [r.overhead_s for r in judges])
    from arl_tangram.managers.gpu.models import folder_weight_bytes

    return {
        "batch": p.trajectories, "calls_min": p.calls_min, "calls_max": p.calls_max,
        "think_mean_s": p.think_mean_s, "think_sigma": p.think_sigma,
        "search_latency_s": search_mean_s + latency_s, "provider_rate_per_s": p.rate_per_s,
        "provider_concurrency": p.tangram_concurrency, "judge_t_ori_s": judge_mean_s + latency_s,
        "judge_weight_bytes": folder_weight_bytes(jm.folder), "judge": jm.name, "judge_replicas": 1, "judge_devices": 1,
        "sigma": search_sigma, "gpu_devices": 1, "platform_latency_s": latency_s,
        "provider_burst": p.burst, "tangram_burst": p.tangram_burst,
    }  # fmt: skip


async def _both(
    p: DeepSearchLiveParams, plans: list[Plan], services: dict[str, SearchService], seed: int, tick: Callable[[], None],
    jm: JudgeModel,
) -> dict[str, tuple[SystemRun, list[Rec], list[float]]]:  # fmt: skip
    """Both systems on one event loop, side by side: the provider's limit, not the 2 cores,
    bounds this workload, so running them together exposes both to the same host load."""
    start = asyncio.Barrier(2)  # passed twice by each: after the baseline's set-up, after tangram's
    async with asyncio.TaskGroup() as group:
        base = group.create_task(_run_semaphore(p, plans, services["semaphore"], seed, tick, start, jm))
        tangram = group.create_task(_run_tangram(p, plans, services["tangram"], tick, start, jm))
    return {"semaphore": base.result(), "tangram": tangram.result()}


def run(opts: LiveOptions, progress: Progress) -> WorkloadResult:
    """Run both systems on the same seeded stream; every search and judge call is awaited
    to its one outcome. Leaves no process or file behind."""
    p = live_params(opts)
    jm = judge_model(opts.judge)
    plans = make_plans(p, opts.seed)
    per_system = sum(len(plan.searches) + 1 for plan in plans)
    progress.start(NAME, 2 * per_system)
    tmp = Path(tempfile.mkdtemp(prefix=f"arl-tangram-{os.getpid()}-deepsearch-"))
    try:
        db = tmp / "corpus.db"
        build_corpus(db)
        settings = ServiceSettings(p.rate_per_s, p.burst, p.latency_s)
        progress.note(NAME, f"both systems at once, each on its own provider (limit {p.rate_per_s:g}/s): {len(plans)} trajectories")
        with SearchService(db, settings) as base_svc, SearchService(db, settings) as tangram_svc:
            services = {"semaphore": base_svc, "tangram": tangram_svc}
            runs = asyncio.run(_both(p, plans, services, opts.seed, lambda: progress.advance(NAME), jm))
            stats = {"semaphore": base_svc.stats(), "tangram": tangram_svc.stats()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for system, (sys_run, _, _) in runs.items():
        sys_run.device_bytes = JUDGE_DEVICE_BYTES  # the judge's one device, in both systems
        sys_run.extra.update({"quota_violations": float(stats[system]["violations"]), "provider_accepted": float(stats[system]["accepted"])})
    return WorkloadResult(NAME, [runs["tangram"][0], runs["semaphore"][0]], _summarise(runs, stats), _fit(p, runs["tangram"][1], jm))
