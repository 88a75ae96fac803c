"""Sim: the DeepSearch workload (web search API calls, judge-model reward; API-heavy).

A trajectory alternates LLM generation with search calls to a rate-limited provider and
ends with a judge (GPT-OSS) reward on GPUs. Every parameter cites shared/PAPER.md or is an
assumption; all are printed in the report.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.elasticity import Table
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.core.topology import QuotaPoolSpec
from arl_tangram.sim.workload import ActionTemplate, TrajectoryPlan, Workload, lognormal

GB = 10**9


@dataclass(frozen=True)
class DeepSearchParams:
    batch: int = 2048  # PAPER: DeepSearch batch 2048
    calls_min: int = 3  # assumption: search calls per trajectory, uniform in [min, max]
    calls_max: int = 10
    think_mean_s: float = 6.0  # assumption: LLM generation between calls (Qwen3-32B, long reasoning)
    think_sigma: float = 0.6  # assumption
    search_latency_s: float = 1.0  # assumption: a web search call's service time
    provider_rate_per_s: float = 200.0  # assumption: the provider key's limit (PAPER: limits far below batch × group size)
    provider_concurrency: int = 400  # assumption
    judge_t_ori_s: float = 0.8  # assumption: judge scoring (prefill-heavy, short output) on one GPU; ~0.3 s on 4
    judge_weight_bytes: int = 65 * GB  # GPT-OSS-120B ships MXFP4 weights of about 65 GB (fits one 80 GB GPU)
    judge_replicas: int = 4  # assumption: the static judge deployment, replicas × devices (16 GPUs, two nodes)
    judge_devices: int = 4
    sigma: float = 0.4  # assumption: lognormal spread of durations

    def describe(self) -> dict[str, object]:
        return asdict(self)


JUDGE_EFFICIENCY = Table((1.0, 0.9, 0.8, 0.7))  # assumption: tensor-parallel efficiency at 1-4 GPUs


def deepsearch_workload(p: DeepSearchParams, seed: int, tenant: str = "deepsearch") -> Workload:
    rng = random.Random(seed)
    plans = []
    for i in range(p.batch):
        phases: list[tuple[float, ActionTemplate]] = []
        for _ in range(rng.randint(p.calls_min, p.calls_max)):
            call = ActionTemplate(
                "search", "api", lognormal(rng, p.search_latency_s, p.sigma), binding_name="search",
                fixed=ResourceVector(quota_tokens=1), category="api",
            )
            phases.append((lognormal(rng, p.think_mean_s, p.think_sigma), call))
        judge = ActionTemplate(
            "judge", "service", lognormal(rng, p.judge_t_ori_s, p.sigma), binding_name="judge",
            key=ResourceKind.GPU, dop_min=1, dop_max=p.judge_devices, per_unit=ResourceVector(gpu_devices=1),
            elasticity=JUDGE_EFFICIENCY, category="reward",
        )
        phases.append((lognormal(rng, p.think_mean_s, p.think_sigma), judge))
        plans.append(TrajectoryPlan(f"{tenant}-{i:05d}", tenant, None, tuple(phases)))
    services = {"judge": ServiceSpec("judge", p.judge_weight_bytes, 1, p.judge_devices)}
    pools = (QuotaPoolSpec("search", p.provider_concurrency, p.provider_rate_per_s),)
    return Workload("deepsearch", tuple(plans), services, pools, p.describe())
