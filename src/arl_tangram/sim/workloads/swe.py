"""Sim: the SWE-style agentic-RL workload (a repository per task, GRPO groups, set-up per
rollout, test suites of seconds, memory-spiky tool calls), as the live ``bench live``
``swe`` workload measures it.

A trajectory (one rollout) has a sandbox for its life: a set-up action first (category
``setup``, out of the ACT comparisons: a pod sets up every rollout; with ``fork`` a group
sets up once and each member pays its share of one setup plus a fork), then a think before
each of the seven actions the live rollout runs (read, grep, a test subset, the memory
spike, lint, the whole suite elastically, the reward's hidden tests).

Memory as live: every action declares its memory demand (``memory_bytes``: the set-up's,
the spike's and the others' grants, the live rollout's figures), so under a per-action
memory policy (``elastic``) an env holds only its idle footprint (the core's prior: the
simulator measures none) and each action its grant while it runs, with ``env_mem_bytes``
the env's ceiling; a pod policy (``k8s-static``) holds ``env_mem_bytes`` for the pod's life.
Every default below
is the live run's measured figure on this machine (``bench live --json``: ``fitted.swe``),
an assumption, or cites shared/PAPER.md; all are printed in the report.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from arl_tangram.core.elasticity import Amdahl, NonElastic
from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind, ResourceVector
from arl_tangram.sim.workload import ActionTemplate, TrajectoryPlan, Workload, lognormal

MIB = 1 << 20
GIB = 1 << 30
#: the live rollout's actions in order: (kind, category); "test" is the elastic suite
KINDS = (("read", "env"), ("grep", "env"), ("test_subset", "env"), ("profile", "env"),
         ("lint", "env"), ("test", "env"), ("reward", "reward"))  # fmt: skip


@dataclass(frozen=True)
class SweParams:
    batch: int = 1280  # PAPER: AI coding batch 1280 trajectories
    group_size: int = 8  # issue 24: G = 8 rollouts per task (a GRPO group)
    think_mean_s: float = 0.45  # the live workload's think (assumption there: env busy ~47% of a rollout on a spec pod, PAPER)
    think_sigma: float = 0.5  # assumption: lognormal spread of each think
    read_mean_s: float = 0.05  # assumption until fitted: ``cat`` of one module
    grep_mean_s: float = 0.05  # assumption until fitted: ``grep -rn`` of the package
    test_subset_mean_s: float = 0.4  # assumption until fitted: the fast tests at DoP 1
    profile_mean_s: float = 0.8  # assumption until fitted: the memory spike (~600 MiB touched)
    lint_mean_s: float = 0.1  # assumption until fitted: ``py_compile`` of the edit
    test_mean_s: float = 2.0  # assumption until fitted: the whole suite's CPU seconds (its t_ori on one core)
    test_serial_fraction: float = 0.1  # the curve the live rollouts declare for the suite
    test_dop_max: int = 32  # assumption: tens of tests bound the useful workers
    reward_mean_s: float = 0.3  # assumption until fitted: the hidden tests at DoP 1
    setup_mean_s: float = 1.5  # assumption until fitted: set-up (code generator + byte-compile) on one core
    fork_s: float = 0.05  # assumption: one fork (a snapshot's new writable layer: O(1))
    fork: bool = False  # tangram's GRPO groups: one setup per group, G-1 forks
    sigma: float = 0.4  # assumption: lognormal spread of action durations
    env_mem_bytes: int = 2 * GIB  # the env's limit: a pod holds it for life (issue 24: the SWE-Gym spec's 2 GiB); per-action memory: a ceiling
    setup_grant_bytes: int = 256 * MIB  # the live rollout's declared demands (bench.live.swe_plan): set-up ...
    spike_grant_bytes: int = 768 * MIB  # ... the memory spike (~600 MiB touched) ...
    action_grant_bytes: int = 128 * MIB  # ... and every other action

    def describe(self) -> dict[str, object]:
        return asdict(self)

    def setup_t_ori_s(self) -> float:
        """What one rollout's set-up costs: a whole setup, or with ``fork`` its share of the
        group's one setup plus G-1 forks."""
        if not self.fork:
            return self.setup_mean_s
        return (self.setup_mean_s + (self.group_size - 1) * self.fork_s) / self.group_size


def memory_of(kind: str, p: SweParams) -> int:
    """The memory demand the live rollout declares for an action of ``kind``."""
    return {"setup": p.setup_grant_bytes, "profile": p.spike_grant_bytes}.get(kind, p.action_grant_bytes)


def _action(kind: str, category: str, t_ori: float, p: SweParams) -> ActionTemplate:
    mem = memory_of(kind, p)
    if kind == "test":
        return ActionTemplate(
            kind, "env", t_ori, key=ResourceKind.CPU, dop_min=1, dop_max=p.test_dop_max,
            per_unit=ResourceVector(cpu_millicores=MILLICORES_PER_CORE), elasticity=Amdahl(p.test_serial_fraction),
            category=category, memory_bytes=mem,
        )  # fmt: skip
    one = ResourceVector(cpu_millicores=MILLICORES_PER_CORE)
    return ActionTemplate(kind, "env", t_ori, fixed=one, elasticity=NonElastic(), category=category, memory_bytes=mem)


def swe_workload(p: SweParams, seed: int, tenant: str = "swe") -> Workload:
    rng = random.Random(seed)
    plans = []
    for i in range(p.batch):
        phases: list[tuple[float, ActionTemplate]] = [(0.0, _action("setup", "setup", lognormal(rng, p.setup_t_ori_s(), p.sigma), p))]
        for kind, category in KINDS:
            mean = float(getattr(p, f"{kind}_mean_s"))
            phases.append((lognormal(rng, p.think_mean_s, p.think_sigma), _action(kind, category, lognormal(rng, mean, p.sigma), p)))
        plans.append(TrajectoryPlan(f"{tenant}-{i:05d}", tenant, p.env_mem_bytes, tuple(phases)))
    return Workload("swe", tuple(plans), parameters=p.describe())
