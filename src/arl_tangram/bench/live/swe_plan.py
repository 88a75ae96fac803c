"""Shell: what the live SWE workload runs: its parameters, the pod sizings of the baselines,
and the seeded per-rollout plans every system replays identically.

Pure. Every parameter is a named field of ``SweConfig`` and cites ../shared/PAPER.md or the
issue, or says it is an assumption; the report prints them all.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from arl_tangram.bench.live.swe_repo import RepoConfig
from arl_tangram.core.policies.elastic import DEFAULT_SHORT_FIRST_SLOWDOWN

MILLICORES_PER_CORE = 1000
MIB = 1 << 20
GIB = 1 << 30
#: the systems, in the order they run (the two fast ones side by side in time)
SYSTEMS = ("k8s-burstable-fit", "tangram", "k8s-spec", "k8s-guaranteed-fit")
#: the action kinds whose ACT every system reports (setup is reported apart, for all)
ACT_KINDS = ("read", "grep", "test_subset", "profile", "lint", "test", "reward")
#: left to the full run by ``--quick``: dominated by construction. k8s-guaranteed-fit is the
#: k8s-burstable-fit sizes with CPU limits added, so it can only be slower, and its memory
#: limit is the same, so its spikes are OOM-killed alike and it loses the same rewards: it
#: can never be the best pod system, and the quick demo's budget is better spent elsewhere.
QUICK_SKIPPED = ("k8s-guaranteed-fit",)
NOT_RUN_QUICK = "not run in --quick (see the full run)"


@dataclass(frozen=True)
class PodSize:
    """One pod's resources: CPU request in millicores (a limit too when ``guaranteed``) and
    memory request = limit."""

    millicores: int
    mem_bytes: int
    guaranteed: bool


@dataclass(frozen=True)
class SweConfig:
    """The workload's parameters (full run by default; ``quick()`` for ``--quick``)."""

    num_tasks: int = 4  # issue 24: T = 4 tasks
    group_size: int = 8  # issue 24: G = 8 rollouts per task (a GRPO group)
    budget_bytes: int = 8 * GIB  # issue 24: one memory budget of 8 GiB for every system
    spec_millicores: int = 1000  # issue 24: SWE-Gym/OpenReward sandbox spec, 1 CPU ...
    spec_mem_bytes: int = 2 * GIB  # ... and 2 GiB, request = limit
    tangram_env_limit_bytes: int = 1 * GIB  # assumption: a tangram env's memory ceiling (its limit, not a reservation, under per-action memory)
    spike_mib: int = 600  # assumption: the memory-spiky step's peak (AgentCgroup shape: ~10x a test run's ~40-60 MiB); over a fit pod's limit at batch >= 16 in 8 GiB
    spike_grant_bytes: int = 768 * MIB  # the spike's declared memory demand (tangram, memory per action)
    action_grant_bytes: int = 128 * MIB  # the other actions' declared memory demand
    setup_grant_bytes: int = 256 * MIB  # the set-up step's declared memory demand
    think_mean_s: float = 0.3  # assumption: LLM generation before each action, scaled with the actions (the coding workload's think keeps the env ~47% busy, PAPER); sized so the demo fits its budget
    think_sigma: float = 0.5  # assumption: lognormal spread of each think
    right_fraction: float = 0.5  # issue 24: half of every group's rollouts get the fix right
    action_timeout_s: float = 600.0  # generous: a Guaranteed-fit pod at 62 millicores runs the suite for ~30 s
    repo: RepoConfig = field(default_factory=RepoConfig)
    systems: tuple[str, ...] = SYSTEMS
    short_first_slowdown: float = DEFAULT_SHORT_FIRST_SLOWDOWN  # tangram's CPU queue order (bench live --short-first-slowdown; 0: FCFS)
    not_run: tuple[str, ...] = ()  # systems left out of this run, which the report names with NOT_RUN_QUICK (quick: QUICK_SKIPPED)
    seed: int = 0

    @classmethod
    def quick(cls, seed: int = 0, short_first_slowdown: float = DEFAULT_SHORT_FIRST_SLOWDOWN) -> SweConfig:
        """``--quick``: half the tasks (issue 24), the same shape, and the dominated pod
        system (``QUICK_SKIPPED``) left to the full run."""
        systems = tuple(s for s in SYSTEMS if s not in QUICK_SKIPPED)
        return cls(num_tasks=2, seed=seed, systems=systems, not_run=QUICK_SKIPPED, short_first_slowdown=short_first_slowdown)

    @property
    def batch(self) -> int:
        return self.num_tasks * self.group_size

    def pod_size(self, system: str, pool_cores: int) -> PodSize:
        """The pod sizing of a baseline: the framework spec, or the batch fitted at once
        (CPU request pool / batch, memory budget / batch)."""
        if system == "k8s-spec":
            return PodSize(self.spec_millicores, self.spec_mem_bytes, True)
        fit_mc = max(1, pool_cores * MILLICORES_PER_CORE // self.batch)
        fit_mem = self.budget_bytes // self.batch
        if system == "k8s-burstable-fit":
            return PodSize(fit_mc, fit_mem, False)
        if system == "k8s-guaranteed-fit":
            return PodSize(fit_mc, fit_mem, True)
        raise ValueError(f"system: a pod system is one of k8s-spec, k8s-burstable-fit, k8s-guaranteed-fit, got {system!r}")

    def describe(self, pool_cores: int) -> dict[str, object]:
        out = asdict(self)
        out["batch"] = self.batch
        out["pods"] = {s: asdict(self.pod_size(s, pool_cores)) for s in self.systems if s != "tangram"}
        return out


@dataclass(frozen=True)
class RolloutPlan:
    """One rollout: its task, its place in the group, whether its edit is the right fix,
    and the think before each of its actions (``ACT_KINDS`` order, then the reward)."""

    rollout_id: str
    task_index: int
    member: int
    right: bool
    think_s: tuple[float, ...]


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    import math

    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if mean > 0 else 0.0


def make_plans(config: SweConfig) -> list[RolloutPlan]:
    """T x G plans, seeded: member g of a group is right when g < right_fraction x G."""
    rng = random.Random(config.seed)
    right_n = round(config.right_fraction * config.group_size)
    plans = []
    for t in range(config.num_tasks):
        for g in range(config.group_size):
            think = tuple(_lognormal(rng, config.think_mean_s, config.think_sigma) for _ in ACT_KINDS)
            plans.append(RolloutPlan(f"swe-{t:02d}-r{g:02d}", t, g, g < right_n, think))
    return plans
