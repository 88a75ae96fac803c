"""Shell: ``arl-tangram bench memory``: memory per action against pods, on one memory
budget (issue 21), live: real sandboxes, cgroups and the controller.

N trajectories, each: an env (limit ``limit``), a setup action that leaves its state in
/tmp (the idle footprint, ``footprint``), then ``calls`` tool calls separated by idle gaps
(the LLM's turn), each allocating a peak drawn from a lognormal with the AgentCgroup shape
(median 10x the footprint, p95 15x: ``PEAK_SIGMA``) and holding it ``hold_s``. Systems, one
after another, each under the same budget cgroup (``memory_budget``) and node memory:
  * ``pods-at-limit``: each env holds its limit for its life (elastic policy with memory per
    action off); the rest wait for a pod (their wait counts as queue time);
  * ``pods-at-average``: limit = budget / N, the kernel OOM-kills a spike over it;
  * ``tangram``: footprints + per-action grants (learned per kind) + pause-and-grow.
Workload figures are assumptions scaled to this 2-core host (labelled in ``--json``'s
``workload``): the shape follows the issue's citation of AgentCgroup, not its sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from arl_tangram.bench.memory_budget import Budget
from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.resources import ResourceVector
from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.runtime.actions import ActionResult, ExecPayload, read_result
from arl_tangram.runtime.config import SchedulerConfig, TangramConfig
from arl_tangram.runtime.controller import Controller
from arl_tangram.runtime.embedded import EmbeddedRuntime

MIB = 1 << 20
PEAK_MEDIAN_X = 10.0  # median tool-call peak / idle footprint (AgentCgroup's shape, per issue 21)
PEAK_SIGMA = math.log(1.5) / 1.645  # p95 = 1.5 x the median = 15x the footprint
RESERVE_FRACTION = 0.05  # of the budget never granted: sandbox inits, kernel memory (assumption)
TOOL_MILLICORES = 250  # a tool call mostly holds memory: a quarter core each (assumption)


@dataclass(frozen=True)
class Workload:
    trajectories: int = 96
    limit_bytes: int = 256 * MIB
    footprint_bytes: int = 2 * MIB
    budget_bytes: int = 2048 * MIB
    calls: int = 2
    gap_s: float = 1.0  # idle between calls (the LLM's turn): an assumption
    hold_s: float = 0.3  # how long a call holds its peak ("a few hundred ms", issue 21)
    seed: int = 0


QUICK = Workload(trajectories=12, limit_bytes=128 * MIB, budget_bytes=512 * MIB, calls=1, gap_s=0.2)


def _peaks(w: Workload) -> list[list[int]]:
    rng = random.Random(w.seed)
    median = PEAK_MEDIAN_X * w.footprint_bytes
    return [[int(median * math.exp(rng.gauss(0.0, PEAK_SIGMA))) for _ in range(w.calls)] for _ in range(w.trajectories)]


class _Run:
    """One system's run: envs alive at once, per-trajectory losses, tool-call results."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.alive = self.peak_alive = 0
        self.lost: set[int] = set()
        self.results: list[ActionResult] = []

    async def action(self, env_id: str, aid: str, kind: str, command: str) -> ActionResult:
        spec = ActionSpec(
            aid, kind, Binding("env", env_id), demand_fixed=ResourceVector(cpu_millicores=TOOL_MILLICORES), timeout_s=120.0
        )  # fmt: skip
        record = self.controller.submit(spec, ExecPayload(command, None, (), None, 120.0))
        result = await read_result(record)
        self.controller.ack(aid)
        return result

    async def trajectory(self, i: int, w: Workload, limit: int, peaks: list[int]) -> None:
        env_id = f"t{i}"
        await self.controller.create_env(EnvSpec(env_id, limit, workspace_bytes=4 * MIB, tmp_bytes=max(4 * MIB, 2 * w.footprint_bytes)))
        self.alive += 1
        self.peak_alive = max(self.peak_alive, self.alive)
        try:
            setup = await self.action(env_id, f"t{i}-setup", "setup", f"head -c {w.footprint_bytes} /dev/urandom > /tmp/state")
            if not setup.ok:
                self.lost.add(i)
            for c, peak in enumerate(peaks):
                await asyncio.sleep(w.gap_s)
                cmd = f"python3 -c \"import time; b = b'x' * {peak}; time.sleep({w.hold_s})\""
                r = await self.action(env_id, f"t{i}-c{c}", "tool", cmd)
                self.results.append(r)
                if not r.ok:
                    self.lost.add(i)
        finally:
            self.alive -= 1
            self.controller.release_env(env_id)


async def _system(name: str, w: Workload, budget: Budget) -> dict[str, Any]:
    per_action = name == "tangram"
    limit = w.limit_bytes if name != "pods-at-average" else max(16 * MIB, w.budget_bytes // w.trajectories)
    params = {"memory_per_action": per_action, "mem_reserve_bytes": int(w.budget_bytes * RESERVE_FRACTION)}
    config = TangramConfig(scheduler=SchedulerConfig("elastic", params))
    cpu = CpuManagerConfig(default_spec=SandboxSpec(limit, 128, 4 * MIB, 4 * MIB))
    with budget.joined():
        rt = await EmbeddedRuntime.start(config, cpu_config=cpu, node_mem_bytes=w.budget_bytes, memory_pause=per_action)
    try:
        run = _Run(rt.controller)
        t0 = time.monotonic()
        await asyncio.gather(*(run.trajectory(i, w, limit, p) for i, p in enumerate(_peaks(w))))
        makespan_s = time.monotonic() - t0
    finally:
        await rt.aclose()
    paused = [r.paused_s for r in run.results if r.paused_s > 0]
    return {
        "peak_alive": run.peak_alive, "lost": len(run.lost), "makespan_s": makespan_s,
        "per_min": w.trajectories / makespan_s * 60.0, "limit_bytes": limit,
        "mean_act_s": statistics.fmean(r.act_s for r in run.results) if run.results else None,
        "oom_killed_actions": sum(r.outcome == "oom_killed" for r in run.results),
        "paused_actions": len(paused), "pause_s_mean": statistics.fmean(paused) if paused else 0.0,
        "act_split_s": _split(run.results),
    }  # fmt: skip


def _split(results: list[ActionResult]) -> dict[str, float | None]:
    """Where the actions' time went (means, s): queued (for memory, cores or a pause),
    start-up overhead, execution, and the CPU time the execution used (exec - cpu: waiting
    for a core on a contended host, or sleeping)."""
    def mean(values: list[float]) -> float | None:
        return statistics.fmean(values) if values else None

    return {
        "queue": mean([r.queue_s for r in results]), "overhead": mean([r.overhead_s for r in results]),
        "exec": mean([r.exec_s for r in results]), "cpu": mean([r.cpu_s for r in results]),
    }  # fmt: skip


async def measure(w: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    budget = Budget(w.budget_bytes)
    try:
        runs = {name: await _system(name, w, budget) for name in ("pods-at-limit", "pods-at-average", "tangram")}
        peak_rss, budget_ooms = budget.peak_bytes(), budget.oom_kills()
    finally:
        budget.remove()
    clean = [runs[n] for n in ("pods-at-limit", "pods-at-average") if runs[n]["lost"] == 0]
    best_pod = max((r["per_min"] for r in clean), default=None)
    tangram = runs["tangram"]
    result = {
        "N": w.trajectories, "env_limit_bytes": w.limit_bytes, "footprint_bytes": w.footprint_bytes,
        "budget_bytes": w.budget_bytes,
        "density_ratio": tangram["peak_alive"] / max(1, runs["pods-at-limit"]["peak_alive"]),
        "oom_killed_tangram": tangram["lost"], "oom_killed_pods_at_average": runs["pods-at-average"]["lost"],
        "throughput_ratio": tangram["per_min"] / best_pod if best_pod else None,
        "mean_act_s": {n: r["mean_act_s"] for n, r in runs.items()},
        "paused_actions": tangram["paused_actions"], "pause_s_mean": tangram["pause_s_mean"],
        "peak_rss_bytes": peak_rss,
    }  # fmt: skip
    context = {"systems": runs, "budget_oom_kills": budget_ooms, "workload": asdict(w),
               "assumptions": "gap_s, hold_s, tool millicores, reserve fraction and sizes are assumptions; shape per AgentCgroup"}  # fmt: skip
    return result, context


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench memory", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--trajectories", type=int, default=None, help="N (default 96; quick 12)")
    args = parser.parse_args(argv)
    w = QUICK if args.quick else Workload()
    if args.trajectories is not None:
        w = Workload(**{**asdict(w), "trajectories": args.trajectories})
    print("bench memory: pods-at-limit, pods-at-average, tangram on one budget (a minute or two)...", file=sys.stderr)
    result, context = asyncio.run(measure(w))
    print("bench memory: context: " + json.dumps(context), file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    return 0
