"""Shell: the live SWE workload of ``arl-tangram bench live``: GRPO groups of SWE-style
rollouts on real task images, run by ARL-Tangram and by the pod sizings people run.

``run(opts, progress)`` (the workload contract of ``common``) builds T task repositories
(``swe_repo``) as images over one cached Debian + python3 base (``swe_images``), then runs
the same seeded plans (``swe_plan``) on each system in turn, on the same cores:

- ``tangram`` (policy ``elastic``): per group, one env is set up once and forked G-1 times
  (``setup_group``); memory is declared per action (an env holds its footprint, its
  ``memory=`` is a ceiling); the suite runs at 1..all cores.
- ``k8s-spec``: a pod per rollout at the framework spec (request = limit = 1 CPU, 2 GiB);
  pods beyond the node's cores wait Pending.
- ``k8s-burstable-fit``: a pod per rollout sized so the batch fits at once (CPU request
  pool / batch as a cpu.shares weight, no CPU limit; memory request = limit = budget / batch):
  the spike is OOM-killed and that rollout's reward is lost.
- ``k8s-guaranteed-fit``: the same sizes as limits (dominated by construction: ``--quick``
  leaves it to the full run, ``swe_plan.QUICK_SKIPPED``).
Every pod system sets up every rollout it runs (``swe_rollout.setup``).
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arl_tangram
from arl_tangram.bench.image_kit import CACHE_DIR
from arl_tangram.bench.live import swe_images
from arl_tangram.bench.live.common import LiveOptions, Progress, WorkloadResult, elastic_params
from arl_tangram.bench.live.swe_plan import PodSize, RolloutPlan, SweConfig, make_plans
from arl_tangram.bench.live.swe_repo import SweTask, make_task
from arl_tangram.bench.live.swe_result import workload_result
from arl_tangram.bench.live.swe_rollout import RolloutContext, RolloutOutcome, rollout, setup
from arl_tangram.client import AsyncClient
from arl_tangram.client.client import Env
from arl_tangram.runtime.config import CpuConfig, SchedulerConfig, TangramConfig
from arl_tangram.runtime.config_images import ImagesConfig, make_image_store

WORKLOAD = "swe"
STORE = CACHE_DIR / "swe-store"  # the bench's image store: the base is unpacked once, kept for later runs


@dataclass(frozen=True)
class Prepared:
    """The tasks, their image references and the store holding them."""

    tasks: list[SweTask]
    references: dict[str, str]
    store_path: Path
    base: str = ""  # which base root the images share


def pool_cores() -> int:
    return len(os.sched_getaffinity(0))


def prepare(config: SweConfig, base: Path | None = None, store_path: Path = STORE, cache_dir: Path = CACHE_DIR) -> Prepared:
    """Build (or reuse) the task images over ``base`` (default: the cached Debian root, else
    a root of the host's files: ``swe_images.default_base``) and
    import them into the store at ``store_path`` before any runtime opens it."""
    tasks = [make_task(i, config.seed, config.repo) for i in range(config.num_tasks)]
    base, base_name = (base, base.name) if base is not None else swe_images.default_base(cache_dir)
    images = swe_images.build_layout(base, tasks, cache_dir)
    swe_images.import_all(make_image_store(ImagesConfig(store_path=str(store_path))), images)
    return Prepared(tasks, images.references, store_path, base_name)


def run(opts: LiveOptions, progress: Progress) -> WorkloadResult:
    """Run the SWE workload on every system; see the module docstring."""
    slowdown = opts.short_first_slowdown
    config = SweConfig.quick(opts.seed, slowdown) if opts.quick else SweConfig(seed=opts.seed, short_first_slowdown=slowdown)
    return asyncio.run(run_async(config, progress))


async def run_async(config: SweConfig, progress: Progress, prepared: Prepared | None = None) -> WorkloadResult:
    cores = pool_cores()
    progress.start(WORKLOAD, config.batch * len(config.systems))
    progress.note(WORKLOAD, f"building {config.num_tasks} task images over the cached base")
    started = time.monotonic()
    ready: Prepared = prepared if prepared is not None else await asyncio.to_thread(prepare, config)
    prepare_s = time.monotonic() - started
    plans = make_plans(config)
    t0 = time.monotonic()
    runs: dict[str, tuple[list[RolloutOutcome], float]] = {}
    wall_s: dict[str, float] = {}  # each system's whole run, its runtime's start and close included
    process_cpu_s: dict[str, dict[str, float]] = {}
    for system in config.systems:
        progress.note(WORKLOAD, f"system {system}: {len(plans)} rollouts")
        begun, cpu_before = time.monotonic(), _process_cpu_s()
        runs[system] = await run_system(system, config, ready, plans, cores, t0, progress)
        wall_s[system] = round(time.monotonic() - begun, 2)
        process_cpu_s[system] = {k: round(v - cpu_before[k], 2) for k, v in _process_cpu_s().items()}
    result = workload_result(runs, config, cores)
    result.summary["prepare_s"] = prepare_s
    result.summary["system_wall_s"] = wall_s
    result.summary["process_cpu_s"] = process_cpu_s
    result.summary["base_image"] = ready.base
    return result


def _process_cpu_s() -> dict[str, float]:
    """CPU seconds of this process (the in-process runtime: controller, dispatcher, manager
    threads, host-side file calls) and of its reaped children (every sandbox process and
    launcher): set beside the actions' own CPU seconds, they show what the machinery costs
    the cores the actions are granted."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"runtime": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}


def system_config(system: str, config: SweConfig, cores: int, store_path: Path) -> TangramConfig:
    """``system``'s runtime: its policy, the task images' store, and the node's sandbox
    memory set to the run's budget (what the scheduler may place)."""
    images, cpu = ImagesConfig(store_path=str(store_path)), CpuConfig(node_mem_bytes=config.budget_bytes)
    if system == "tangram":
        params = elastic_params(short_first_slowdown=config.short_first_slowdown)
        return TangramConfig(scheduler=SchedulerConfig("elastic", params), cpu=cpu, images=images)  # type: ignore[arg-type]
    pod = config.pod_size(system, cores)
    return TangramConfig(scheduler=SchedulerConfig("k8s-static", {"pod_millicores": pod.millicores}), cpu=cpu, images=images)


def limit_run_memory(tg: AsyncClient, budget_bytes: int) -> bool:
    """The cgroup around the run: the memory limit of the CPU manager's root group, above
    every sandbox's own, so the host's other work never decides what fits (cgroup v1 with
    hierarchical accounting, or v2; elsewhere False and only the scheduler keeps to the budget)."""
    return bool(_cpu_manager(tg).driver.limit_root_memory(budget_bytes))


def _cpu_manager(tg: AsyncClient) -> Any:
    """The in-process runtime's CPU manager (the bench runs the runtime in its own process)."""
    return tg.transport.runtime.agent.cpu  # type: ignore[attr-defined]


async def run_system(
    system: str, config: SweConfig, prepared: Prepared, plans: list[RolloutPlan], cores: int, t0: float, progress: Progress
) -> tuple[list[RolloutOutcome], float]:  # fmt: skip
    """Every rollout of the batch at once on a fresh runtime of ``system``; returns
    (outcomes, step seconds: first rollout start to last reward)."""
    async with arl_tangram.connect(config=system_config(system, config, cores, prepared.store_path), tenant=WORKLOAD) as tg:
        footprint_of = _cpu_manager(tg).footprint_bytes if system == "tangram" else None
        ctx = RolloutContext(system, config, cores, t0, footprint_of)
        limit_run_memory(tg, config.budget_bytes)
        async with asyncio.TaskGroup() as group:
            if system == "tangram":
                tasks = [group.create_task(_tangram_group(ctx, tg, prepared, [p for p in plans if p.task_index == t], progress))
                         for t in range(config.num_tasks)]  # fmt: skip
            else:
                tasks = [group.create_task(_as_list(_pod_rollout(ctx, tg, prepared, plan, progress))) for plan in plans]
        outcomes = [o for t in tasks for o in t.result()]
    step_s = max(o.ended_s for o in outcomes) - min(o.started_s for o in outcomes)
    return outcomes, step_s


async def _as_list(call: Awaitable[RolloutOutcome]) -> list[RolloutOutcome]:
    return [await call]


async def open_pod(tg: AsyncClient, pod: PodSize, image: str, trajectory_id: str = "") -> Env:
    """A pod: an env of the pod's memory limit on a ``k8s-static`` runtime (which holds its
    CPU request as a Guaranteed quota for its life, Pending while the node is full); a
    Burstable pod's request then becomes a cpu.shares weight with no quota, on all cpus."""
    env = await tg.create_env(image=image, memory=pod.mem_bytes, trajectory_id=trajectory_id)
    if not pod.guaranteed:
        try:
            await asyncio.to_thread(_cpu_manager(tg).hold, env.env_id, pod.millicores, limit=False)
        except BaseException:
            await env.release()
            raise
    return env


async def _pod_rollout(ctx: RolloutContext, tg: AsyncClient, prepared: Prepared, plan: RolloutPlan, progress: Progress) -> RolloutOutcome:
    """A pod per rollout: create it (Pending while the node is full), set it up, run the
    rollout, release it. Its reservation runs from its start to its release."""
    task = prepared.tasks[plan.task_index]
    pod = ctx.config.pod_size(ctx.system, ctx.pool_cores)
    out = RolloutOutcome(plan, ctx.now(), reserved_mem_bytes=pod.mem_bytes, reserved_millicores=pod.millicores)
    env = await open_pod(tg, pod, prepared.references[task.task_id], plan.rollout_id)
    out.env_ready_s = ctx.now()
    try:
        s = await setup(ctx, env, out.setup)
        out.setup_s = s.act_s
        if s.outcome != "succeeded":
            out.lost += 1
        await rollout(ctx, env, task, out, out.env_ready_s - out.started_s)
    finally:
        await env.release()
    progress.advance(WORKLOAD)
    return out


async def setup_group(ctx: RolloutContext, tg: AsyncClient, image: str, plans: list[RolloutPlan]) -> tuple[list[Env], list[RolloutOutcome]]:
    """Tangram's set-up of one GRPO group: one env, set up once, then forked G-1 times, so
    the children start from the set-up state. Returns the G envs (member order) and their
    outcomes, each charged one setup plus the forks over G. The envs reserve nothing for
    their life: memory is granted per action, and each holds its footprint between them."""
    outs = [RolloutOutcome(p, ctx.now()) for p in plans]
    parent = await tg.create_env(image=image, memory=ctx.config.tangram_env_limit_bytes, trajectory_id=plans[0].rollout_id)
    ready_s = ctx.now()
    try:
        s = await setup(ctx, parent, outs[0].setup)
        children = await parent.fork(len(plans) - 1)
    except BaseException:
        await parent.release()  # the group never started: nothing of it may outlive the call
        raise
    share_s = (ctx.now() - ready_s) / len(plans)
    for o in outs:
        o.env_ready_s, o.setup_s, o.lost = ready_s, share_s, int(s.outcome != "succeeded")
    return [parent, *children], outs


async def _tangram_group(ctx: RolloutContext, tg: AsyncClient, prepared: Prepared, plans: list[RolloutPlan], progress: Progress) -> list[RolloutOutcome]:
    """One group on tangram: set up once, forked G-1 times, the G members run at once."""
    task = prepared.tasks[plans[0].task_index]
    envs, outs = await setup_group(ctx, tg, prepared.references[task.task_id], plans)
    try:
        async with asyncio.TaskGroup() as group:
            for env, out in zip(envs, outs, strict=True):
                group.create_task(_member(ctx, env, task, out, progress))
    finally:
        for env in envs:
            await env.release()
    return outs


async def _member(ctx: RolloutContext, env: Env, task: SweTask, out: RolloutOutcome, progress: Progress) -> None:
    await rollout(ctx, env, task, out, out.env_ready_s - out.started_s)
    progress.advance(WORKLOAD)
