"""Shell: the live AI-coding workload of ``arl-tangram bench live``: HumanEval trajectories
on real sandboxes, run by ARL-Tangram and by the Kubernetes pod-per-trajectory baselines.

``run(opts, progress)`` (the workload contract of ``common``) runs the same seeded plans on
each system in turn, one after another on the same cores: ``tangram`` (policy ``elastic``:
Allocate-on-Execution, each action granted 1..all cores), ``k8s-guaranteed`` (policy
``k8s-static``: a pod of request = limit = pool cores / batch held as a real cgroup quota
for the trajectory's life) and ``k8s-burstable`` (the same request as cpu.shares weight,
no limit, all cpus); in both, a test run's DoP is the pod's request in whole cores, at least
1 (PAPER: a test runner uses as many workers as the pod has cores). A trajectory has the shape of the
simulator's coding workload: a think (a sleep: no LLM runs) before every action; per turn
it writes its solution and lints it, then runs the problem's tests elastically (the sandbox
runner splits repeated checks over ``$TANGRAM_DOP`` processes); a failed first attempt is
retried with the canonical solution; at the end the MiniLM reward service scores the final
solution against the canonical one (the reward: the tests' verdict plus that score).
The reward service (one MiniLM on one CPU device) is shared by every system: with one model
there is nothing to pool, so a static deployment and Evict-on-Execution serve it the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

import arl_tangram
from arl_tangram.bench.live.coding_plan import (
    Calibration,
    CodingConfig,
    Problem,
    TrajectoryPlan,
    calibrated,
    candidate_problems,
    make_plans,
)
from arl_tangram.bench.live.coding_records import ActionRecord, TrajectoryOutcome
from arl_tangram.bench.live.coding_result import workload_result
from arl_tangram.bench.live.common import (
    LiveOptions,
    Progress,
    SystemRun,
    WorkloadResult,
    elastic_params,
)
from arl_tangram.client import AsyncClient, Elastic
from arl_tangram.runtime.actions import ActionResult
from arl_tangram.runtime.config import GpuConfig, SchedulerConfig, TangramConfig

WORKLOAD = "coding"
SYSTEMS = ("k8s-burstable", "tangram", "k8s-guaranteed")  # the two fast systems side by side in time
REWARD_SERVICE = "reward/minilm"
RUNNER_SOURCE = resources.files("arl_tangram.bench.live").joinpath("coding_runner.py").read_text(encoding="utf-8")


@dataclass
class SystemContext:
    """What a system's trajectories share: its client, the reward client, the plans' problems."""

    system: str
    tg: AsyncClient
    reward: AsyncClient
    problems: dict[str, Problem]
    config: CodingConfig
    pool_cores: int
    serial_fraction: float  # the tests' declared curve (``Calibration.serial_fraction``)
    t0: float
    burstable_millicores: int = 0


def pool_cores() -> int:
    """The cores every system's sandboxes share ("equal cores": the same cpuset for all)."""
    return len(os.sched_getaffinity(0))


def run(opts: LiveOptions, progress: Progress) -> WorkloadResult:
    """Run the coding workload on every system; see the module docstring."""
    config = CodingConfig.quick(opts.seed) if opts.quick else CodingConfig(seed=opts.seed)
    config = dataclasses.replace(
        config, preempt_quantum_s=opts.preempt_quantum_s, short_first_slowdown=opts.short_first_slowdown, cpu_packing=opts.cpu_packing
    )
    return asyncio.run(run_async(config, progress))


async def run_async(config: CodingConfig, progress: Progress, systems: tuple[str, ...] = SYSTEMS) -> WorkloadResult:
    cores = pool_cores()
    load_before = os.getloadavg()[0]  # the host is shared: its load is part of the figures
    progress.start(WORKLOAD, config.num_trajectories * len(systems) * config.steps)
    reward_config = TangramConfig(gpu=GpuConfig(devices=1, device_mem_bytes=256 << 20))
    async with arl_tangram.connect(config=reward_config, tenant="reward") as reward:
        progress.note(WORKLOAD, "loading MiniLM reward service; calibrating HumanEval problems in a sandbox")
        # the model loads on a worker thread while the sandbox checks the problems (both take
        # seconds); the turns are timed once it has loaded, alone on the pool
        async with asyncio.TaskGroup() as group:
            loading = group.create_task(_register_reward(reward))
            calibrating = group.create_task(_calibrate(reward, config, cores, loading))
        problems, calibration = calibrating.result()
        by_id = {p.task_id: p for p in problems}
        device_bytes = _service_bytes(reward)
        t0 = time.monotonic()  # one clock for every system and step: their spans never overlap
        done: dict[str, list[tuple[list[TrajectoryOutcome], float, float]]] = {s: [] for s in systems}
        for step in range(config.steps):  # every system runs each step's batch, one after another
            plans = make_plans(replace(config, seed=config.seed + step), problems, cores, calibration.turn_core_s)
            for system in systems:
                progress.note(WORKLOAD, f"step {step + 1}/{config.steps}, system {system}: {len(plans)} trajectories")
                load_1m = os.getloadavg()[0]
                outcomes, step_s = await _run_system(system, reward, by_id, plans, config, cores, calibration, t0, progress)
                done[system].append((outcomes, step_s, (load_1m + os.getloadavg()[0]) / 2))
        runs: dict[str, tuple[SystemRun, list[TrajectoryOutcome]]] = {}
        for system, steps in done.items():
            outcomes = [o for outs, _, _ in steps for o in outs]
            step_s = statistics.fmean(s for _, s, _ in steps)
            runs[system] = (_system_run(system, outcomes, step_s, config, cores, device_bytes), outcomes)
            runs[system][0].extra["host_load_1m"] = statistics.fmean(load for _, _, load in steps)  # systems run at different times
    result = workload_result(runs, config, problems, cores, calibration)
    result.summary["host_load_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    result.summary["step_s_each"] = {system: [round(s, 3) for _, s, _ in steps] for system, steps in done.items()}
    return result


async def _register_reward(reward: AsyncClient) -> None:
    """Register the MiniLM reward service. Its package's first import (torch, seconds of
    CPU) runs on a worker thread too, so the event loop meanwhile starts the calibration's
    sandbox instead of waiting for it."""

    def folder() -> str:
        from arl_tangram.managers.gpu.models import minilm_path

        return str(minilm_path())

    await reward.register_service(REWARD_SERVICE, handler="score", folder=await asyncio.to_thread(folder))


async def _calibrate(
    client: AsyncClient, config: CodingConfig, cores: int, quiet: Awaitable[object] | None = None
) -> tuple[list[Problem], Calibration]:
    """Inside one sandbox: check every candidate's variants and time its check; then, once
    ``quiet`` is done (whatever else loads the cores), alone on the pool, for each of the
    first ``calibration_problems`` problems kept run one turn (lint + canonical test run at
    DoP 1) and the same test run on all ``cores``. Their CPU seconds set the think time,
    their run times the tests' declared curve (``Calibration``)."""
    candidates = candidate_problems(config.num_problems, config.seed)
    async with await client.create_env(memory=config.env_mem) as env:
        await env.write_file("runner.py", RUNNER_SOURCE)
        await env.write_file("problems.json", json.dumps([p.calibration_entry() for p in candidates]))
        r = await env.exec("python3 runner.py --calibrate problems.json", cpu=1, timeout_s=120.0, kind="calibrate")
        if not r.ok:
            raise RuntimeError(f"coding: calibration failed ({r.outcome}, {r.cause}): {r.stderr[-500:]}")
        problems = calibrated(candidates, json.loads(r.stdout), config)
        if quiet is not None:
            await quiet  # a model loading beside the DoP-n runs would make them look serial
        turns_core_s, serials = [], []
        for p in problems[: max(1, config.calibration_problems)]:
            await env.write_file("problem.json", json.dumps({"test": p.test, "entry_point": p.entry_point, "reps": p.reps}))
            await env.write_file("sol.py", p.solution("canonical"))
            lint = await env.exec("python3 -m py_compile sol.py", cpu=1, kind="calibrate")
            runs = [await env.exec("python3 runner.py problem.json sol.py", cpu=n, timeout_s=120.0, kind="calibrate") for n in (1, cores)]
            if not (lint.ok and all(t.ok for t in runs)):
                raise RuntimeError(f"coding: the calibration turn of {p.task_id} failed: lint {lint.outcome}, tests {[t.outcome for t in runs]}")
            turns_core_s.append(lint.cpu_s + runs[0].cpu_s)
            serials.append(Calibration.serial_from(runs[0].exec_s, runs[1].exec_s, cores))
    return problems, Calibration(statistics.fmean(turns_core_s), statistics.median(serials), len(turns_core_s))


def _service_bytes(client: AsyncClient) -> int:
    """Device memory the reward service's replica takes (the same in every system)."""
    gpu = client.transport.runtime.agent.gpu  # type: ignore[attr-defined]
    return int(gpu.footprint_bytes(REWARD_SERVICE, 1)) if gpu is not None else 0


def _system_config(system: str, config: CodingConfig, cores: int) -> TangramConfig:
    if system == "tangram":
        params = elastic_params(config.preempt_quantum_s, config.short_first_slowdown, config.cpu_packing)
        return TangramConfig(scheduler=SchedulerConfig("elastic", params))  # type: ignore[arg-type]
    if system in ("k8s-guaranteed", "k8s-burstable"):
        return TangramConfig(scheduler=SchedulerConfig("k8s-static", {"pod_millicores": config.pod_millicores(cores)}))
    raise ValueError(f"system: must be one of {', '.join(SYSTEMS)}, got {system!r}")


async def _run_system(
    system: str, reward: AsyncClient, problems: dict[str, Problem], plans: list[TrajectoryPlan],
    config: CodingConfig, cores: int, calibration: Calibration, t0: float, progress: Progress,
) -> tuple[list[TrajectoryOutcome], float]:  # fmt: skip
    """All trajectories at once on a fresh runtime of ``system``, their times measured from
    ``t0`` (monotonic); returns (outcomes, step seconds)."""
    async with arl_tangram.connect(config=_system_config(system, config, cores), tenant=WORKLOAD) as tg:
        burstable = config.pod_millicores(cores) if system == "k8s-burstable" else 0
        ctx = SystemContext(system, tg, reward, problems, config, cores, calibration.serial_fraction, t0, burstable)
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_trajectory(ctx, plan, progress)) for plan in plans]
        outcomes = [t.result() for t in tasks]
    step_s = max(o.ended_s for o in outcomes) - min(o.started_s for o in outcomes)
    return outcomes, step_s


def _now(ctx: SystemContext) -> float:
    return time.monotonic() - ctx.t0


async def _trajectory(ctx: SystemContext, plan: TrajectoryPlan, progress: Progress) -> TrajectoryOutcome:
    """One trajectory: create its env (a pod in the baselines) while the LLM writes the
    first attempt; up to two turns of (think, write, lint; think, test); then think and ask
    the reward model to score the final solution. Whatever of the env's start-up outlasts
    the first think counts in the first action's queue time (PAPER: a Pending pod delays the
    trajectory's first action)."""
    out = TrajectoryOutcome(plan, _now(ctx))
    problem = ctx.problems[plan.task_id]
    env, _ = await asyncio.gather(_create_env(ctx, plan, out), asyncio.sleep(plan.think_s[0]))
    out.env_wait_s = max(0.0, _now(ctx) - out.started_s - plan.think_s[0])
    try:
        if ctx.burstable_millicores:
            # Burstable: the pod's request becomes a cpu.shares weight with no quota, on all
            # cpus, replacing the Guaranteed holding the k8s-static policy placed it with.
            cpu = ctx.tg.transport.runtime.agent.cpu  # type: ignore[attr-defined]
            await asyncio.to_thread(cpu.hold, env.env_id, ctx.burstable_millicores, limit=False)
        await env.write_file("runner.py", RUNNER_SOURCE)
        await env.write_file("problem.json", json.dumps({"test": problem.test, "entry_point": problem.entry_point, "reps": problem.reps}))
        variants = [plan.first_variant] if plan.first_variant == "canonical" else [plan.first_variant, "canonical"]
        for turn, variant in enumerate(variants):
            think_s = plan.think_s[2 * turn : 2 * turn + 2]
            if turn == 0:  # the first think ran beside the env's creation
                think_s = (0.0, think_s[1])
            if await _turn(ctx, env, problem, variant, out, think_s):
                break
        await asyncio.sleep(plan.think_s[-1])  # the LLM writes its final answer
        request = {"a": problem.solution(variants[turn])[len(problem.prompt) :], "b": problem.canonical_body}
        score = await _action(ctx, out, "reward", ctx.reward.call(REWARD_SERVICE, request))
        out.lost += 0 if score.ok else 1
        out.scores.append((variants[turn], float((score.output or {}).get("score", 0.0))))
    finally:
        await env.release()
    out.ended_s = _now(ctx)
    progress.advance(WORKLOAD)
    return out


async def _create_env(ctx: SystemContext, plan: TrajectoryPlan, out: TrajectoryOutcome) -> Any:
    env = await ctx.tg.create_env(memory=ctx.config.env_mem, trajectory_id=plan.trajectory_id)
    out.env_start_s = _now(ctx) - out.started_s
    return env


async def _turn(
    ctx: SystemContext, env: Any, problem: Problem, variant: str, out: TrajectoryOutcome, think_s: tuple[float, ...]
) -> bool:
    """Think, write and lint one attempt; think, run its tests. Returns the test verdict."""
    first = not out.actions
    await asyncio.sleep(think_s[0])  # the LLM writes the attempt
    await env.write_file("sol.py", problem.solution(variant))
    lint = await _action(ctx, out, "env", env.exec("python3 -m py_compile sol.py", cpu=1, kind="lint"), out.env_wait_s if first else 0.0)
    await asyncio.sleep(think_s[1])  # the LLM decides to run the tests
    cpu = Elastic(1, ctx.pool_cores, serial_fraction=ctx.serial_fraction)
    test = await _action(ctx, out, "env", env.exec(
        "python3 runner.py problem.json sol.py", cpu=cpu, kind="test", timeout_s=ctx.config.test_timeout_s))  # fmt: skip
    passed = test.outcome == "succeeded" and _report(test).get("reps_run") == problem.reps
    if lint.outcome != "succeeded" or test.outcome not in ("succeeded", "failed"):
        out.lost += 1
    out.verdicts.append((variant, passed))
    return passed


async def _action(ctx: SystemContext, out: TrajectoryOutcome, category: str, call: Any, extra_queue_s: float = 0.0) -> ActionResult:
    submitted_s = _now(ctx)
    result: ActionResult = await call
    if extra_queue_s:
        result = _with_queue(result, extra_queue_s)
        submitted_s -= extra_queue_s
    out.actions.append(ActionRecord(category, result.kind, submitted_s, result))
    return result


def _with_queue(result: ActionResult, extra_s: float) -> ActionResult:
    return replace(result, queue_s=result.queue_s + extra_s)


def _report(result: ActionResult) -> dict[str, Any]:
    """The runner's JSON line, or {} when it printed none (a crash)."""
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return report if isinstance(report, dict) else {}


def _system_run(
    system: str, outcomes: list[TrajectoryOutcome], step_s: float, config: CodingConfig, cores: int, device_bytes: int
) -> SystemRun:
    """Per-action ACT split, CPU reserved vs used (and their spans over time), per system."""
    actions = [a for o in outcomes for a in o.actions]
    reserved, used = [], []
    for a in actions:
        if a.category != "env":
            continue
        start_s = a.submitted_s + a.result.queue_s
        end_s = start_s + a.result.exec_s + a.result.overhead_s
        used.append((start_s, start_s + a.result.exec_s, a.result.cpu_s))
        if system == "tangram":  # Allocate-on-Execution: cores held only while an action runs
            reserved.append((start_s, end_s, float(a.result.dop or 1)))
    if system != "tangram":  # a pod holds its request from creation to release
        pod_cores = config.pod_millicores(cores) / 1000
        reserved = [(o.started_s, o.ended_s, pod_cores) for o in outcomes]
    return SystemRun(
        system=system,
        act_s=[a.result.act_s for a in actions],
        queue_s=[a.result.queue_s for a in actions],
        exec_s=[a.result.exec_s for a in actions],
        overhead_s=[a.result.overhead_s for a in actions],
        step_s=step_s,
        core_s_reserved=sum((e - s) * c for s, e, c in reserved),
        core_s_used=sum(c for _, _, c in used),
        device_bytes=device_bytes,
        reserved_spans=reserved,
        used_spans=used,
    )
