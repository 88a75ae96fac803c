"""Sim: the AI-coding workload (SWE-like sandboxes; CPU-heavy).

A trajectory holds a sandbox for its life and alternates LLM generation (think time) with
env actions: single commands (non-elastic) and test runs (elastic across cores), ending
with the reward test run. Every parameter below cites shared/PAPER.md or is an assumption;
all are printed in the report.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from arl_tangram.core.elasticity import Amdahl, NonElastic
from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind, ResourceVector
from arl_tangram.sim.workload import ActionTemplate, TrajectoryPlan, Workload, lognormal

GIB = 1 << 30


@dataclass(frozen=True)
class CodingParams:
    batch: int = 1280  # PAPER: AI coding batch 1280 trajectories
    turns_min: int = 6  # assumption: env actions per trajectory, uniform in [min, max]
    turns_max: int = 14
    think_mean_s: float = 2.3  # assumption: mean LLM generation per turn, calibrated so the env executes 47% of a trajectory's life under the k8s baseline (PAPER: 47%; measured 0.47 at seed 1, reported as env_busy_fraction)
    think_sigma: float = 0.6  # assumption: lognormal spread of think time
    command_mean_s: float = 0.6  # assumption: single commands (ls, cat, python snippet), non-elastic
    test_fraction: float = 0.4  # assumption: share of env actions that are test runs
    test_t_ori_mean_s: float = 10.0  # assumption: a test run on one core; at ~6-8 cores it takes ~1.5-2 s, so mean exec ≈1 s over all actions (PAPER: ~1 s exec)
    attempts_max: int = 0  # assumption: 0 mixes env actions at random (turns_min..turns_max, test_fraction); n > 0 makes each trajectory 1..n attempts, each a command (write + lint) then a test run
    retry_fraction: float = 0.0  # with attempts_max: the chance that an attempt's tests fail and the trajectory tries again
    test_fail_t_ori_mean_s: float = 0.0  # with attempts_max: a failing run's time on one core (it stops at its first failing check)
    test_serial_fraction: float = 0.04  # assumption: test runs scale well up to their test count (PAPER: calibrating section); the mean of the per-run draws and the curve clients declare
    serial_sigma: float = 0.6  # assumption: lognormal spread of each test run's true serial fraction around the mean (suites differ); 0 gives every run the declared curve
    test_dop_max: int = 32  # assumption: test cases per run bound the useful workers
    reward_t_ori_mean_s: float = 16.0  # assumption: the final reward run executes the full test suite
    env_mem_bytes: int = 2 * GIB  # assumption: sandbox memory held for the trajectory's life
    sigma: float = 0.5  # assumption: lognormal spread of action durations

    def describe(self) -> dict[str, object]:
        return asdict(self)


def _test_run(kind: str, t_ori: float, p: CodingParams, category: str, rng: random.Random) -> ActionTemplate:
    """A test run whose true Amdahl curve is drawn per run; its client declares the kind's
    profiled curve (the paper profiles E offline per kind), so the policy never sees the draw."""
    serial = p.test_serial_fraction
    if p.serial_sigma > 0 and serial > 0:
        serial = min(1.0, lognormal(rng, serial, p.serial_sigma))
    return ActionTemplate(
        kind, "env", t_ori, key=ResourceKind.CPU, dop_min=1, dop_max=p.test_dop_max,
        per_unit=ResourceVector(cpu_millicores=MILLICORES_PER_CORE), elasticity=Amdahl(serial),
        category=category, declared=Amdahl(p.test_serial_fraction),
    )


def _mixed(p: CodingParams, rng: random.Random) -> Iterator[tuple[float, str, float]]:
    """(think, kind, t_ori) of ``turns_min..turns_max`` env actions, each a test run with
    ``test_fraction``, else a single command."""
    for _ in range(rng.randint(p.turns_min, p.turns_max)):
        think = lognormal(rng, p.think_mean_s, p.think_sigma)
        if rng.random() < p.test_fraction:
            yield think, "test", lognormal(rng, p.test_t_ori_mean_s, p.sigma)
        else:
            yield think, "command", lognormal(rng, p.command_mean_s, p.sigma)


def _attempts(p: CodingParams, rng: random.Random) -> Iterator[tuple[float, str, float]]:
    """(think, kind, t_ori) of up to ``attempts_max`` attempts, each a command then a test run:
    another attempt follows with ``retry_fraction``, and every run but the last fails fast.
    (Whether a trajectory retries is drawn first, so its shape fixes where its load falls:
    the batch's first actions are all commands, as in a live rollout.)"""
    n = 1
    while n < p.attempts_max and rng.random() < p.retry_fraction:
        n += 1
    for k in range(n):
        yield lognormal(rng, p.think_mean_s, p.think_sigma), "command", lognormal(rng, p.command_mean_s, p.sigma)
        mean_s = p.test_t_ori_mean_s if k == n - 1 else p.test_fail_t_ori_mean_s
        yield lognormal(rng, p.think_mean_s, p.think_sigma), "test", lognormal(rng, mean_s, p.sigma)


def coding_workload(p: CodingParams, seed: int, tenant: str = "coding") -> Workload:
    rng = random.Random(seed)
    command = ResourceVector(cpu_millicores=MILLICORES_PER_CORE)
    plans = []
    for i in range(p.batch):
        phases: list[tuple[float, ActionTemplate]] = []
        for think, kind, t_ori in _attempts(p, rng) if p.attempts_max > 0 else _mixed(p, rng):
            if kind == "test":
                tpl = _test_run("test", t_ori, p, "env", rng)
            else:
                tpl = ActionTemplate("command", "env", t_ori, fixed=command, elasticity=NonElastic())
            phases.append((think, tpl))
        reward = _test_run("reward", lognormal(rng, p.reward_t_ori_mean_s, p.sigma), p, "reward", rng)
        phases.append((lognormal(rng, p.think_mean_s, p.think_sigma), reward))
        plans.append(TrajectoryPlan(f"{tenant}-{i:05d}", tenant, p.env_mem_bytes, tuple(phases)))
    return Workload("coding", tuple(plans), parameters=p.describe())
