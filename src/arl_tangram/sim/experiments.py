"""Sim: the paper's experiments as declarative runs, executed in parallel worker processes.

A ``RunSpec`` names everything a run needs (workload and its parameters, policy, platform,
cluster, seed), so a run is reproducible from its spec alone and can execute in any process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.topology import ClusterSpec, GpuNodeSpec, uniform_cluster
from arl_tangram.sim import platform as platforms
from arl_tangram.sim.bound import capacity_bound, instance_from_run
from arl_tangram.sim.processor_sharing import processor_sharing_mean_act_s
from arl_tangram.sim.runner import Simulation
from arl_tangram.sim.workload import Workload
from arl_tangram.sim.workloads.coding import CodingParams, coding_workload
from arl_tangram.sim.workloads.deepsearch import DeepSearchParams, deepsearch_workload
from arl_tangram.sim.workloads.mopd import MopdParams, mopd_workload, teacher_names
from arl_tangram.sim.workloads.swe import SweParams, swe_workload

PLATFORMS = {
    "tangram": platforms.TANGRAM,
    "k8s": platforms.K8S,
    "k8s+cp": platforms.K8S_CONTROL_PLANE,
    "ideal": platforms.IDEAL,
}

PAPER_CPU_NODES = 15  # PAPER: CPU pool 15 nodes × 256 cores
PAPER_GPU_NODES = 5  # PAPER: GPU pool 5 nodes × 8 GPUs


@dataclass(frozen=True)
class RunSpec:
    experiment: str
    label: str
    workload: str  # coding | deepsearch | mopd | swe
    workload_params: dict[str, Any]
    policy: str
    policy_params: dict[str, Any] = field(default_factory=dict)
    platform: str = "tangram"
    cpu_nodes: int = 0
    cores_per_node: int = 256
    gpus: int = 0
    seed: int = 1
    bound: bool = False  # also compute the capacity bound on this run's arrivals (coding)


def build_workload(spec: RunSpec) -> Workload:
    if spec.workload == "coding":
        return coding_workload(CodingParams(**spec.workload_params), spec.seed)
    if spec.workload == "deepsearch":
        return deepsearch_workload(DeepSearchParams(**spec.workload_params), spec.seed)
    if spec.workload == "swe":
        return swe_workload(SweParams(**spec.workload_params), spec.seed)
    return mopd_workload(MopdParams(**spec.workload_params), spec.seed)


def gpu_nodes(total: int) -> tuple[GpuNodeSpec, ...]:
    """``total`` GPUs as full 8-GPU nodes plus power-of-two remainders (e.g. 10 = 8 + 2)."""
    nodes: list[GpuNodeSpec] = []
    left = total
    while left > 0:
        size = 8 if left >= 8 else 1 << (left.bit_length() - 1)
        nodes.append(GpuNodeSpec(f"gpu-{len(nodes):03d}", size))
        left -= size
    return tuple(nodes)


def build_cluster(spec: RunSpec, workload: Workload) -> ClusterSpec:
    base = uniform_cluster(spec.cpu_nodes, spec.cores_per_node, quota_pools=workload.quota_pools, services=workload.services)
    return ClusterSpec(base.cpu_nodes, gpu_nodes(spec.gpus), base.quota_pools, base.services)


def _quantiles(values: list[float], n: int = 200) -> list[float]:
    if not values:
        return []
    return [float(x) for x in np.quantile(np.array(values), np.linspace(0.0, 1.0, n))]


def execute(spec: RunSpec) -> dict[str, Any]:
    """Run one spec; returns its summary row (plain data, safe to send between processes)."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    workload = build_workload(spec)
    cluster = build_cluster(spec, workload)
    policy = make_policy(spec.policy, **spec.policy_params)
    result = Simulation(cluster, policy, PLATFORMS[spec.platform], workload, seed=spec.seed).run()
    m = result.metrics
    cores = spec.cpu_nodes * spec.cores_per_node
    step = m.step_s()
    row: dict[str, Any] = {
        "experiment": spec.experiment,
        "label": spec.label,
        "policy": spec.policy,
        "platform": PLATFORMS[spec.platform].name,
        "batch": spec.workload_params.get("batch"),
        "gpus": spec.gpus,
        "act": m.act_summary(),
        "act_by_category": {c: m.act_summary(c) for c in sorted({r.category for r in m.done()})},
        "step_s": step,
        "rejected": m.rejected,
        "env_busy_fraction": m.env_busy_fraction() if spec.workload == "coding" else None,
        "rounds": result.rounds,
        "wall_s": time.perf_counter() - t0,
        "act_quantiles": _quantiles([r.act_s for r in m.done()]),
        "parameters": dict(workload.parameters),
        "platform_parameters": PLATFORMS[spec.platform].describe(),
    }
    if spec.bound:
        inst = instance_from_run(workload.trajectories, m.actions, cores, PLATFORMS[spec.platform].action_overhead_s)
        b = capacity_bound(inst)
        row["bound"] = {"mean_s": b.mean_s, "ideal_mean_s": b.ideal_mean_s, "iterations": b.iterations, "actions": len(inst.arrivals_s)}
        row["processor_sharing"] = {"mean_s": processor_sharing_mean_act_s(inst)}  # same arrivals (sim/processor_sharing.py)
    if cores:
        row["cpu"] = m.utilisation("cpu", cores)
        row["cpu_series"] = [s.tolist() for s in m.reserved["cpu"].series(step, 100)] + [m.used["cpu"].series(step, 100)[1].tolist()]
    if spec.gpus:
        row["gpu"] = m.utilisation("gpu", spec.gpus)
    # CPU seconds, unlike wall time, do not grow when other work shares the host's cores.
    row["cpu_s"] = time.process_time() - cpu0
    return row


def run_all(specs: Iterable[RunSpec], workers: int | None = None, progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Execute specs on ``workers`` processes (default: the machine's cores); results in spec order."""
    specs = list(specs)
    workers = workers or os.cpu_count() or 1
    # Longest runs first so the pool's tail is short.
    order = sorted(range(len(specs)), key=lambda i: -_cost_hint(specs[i]))
    results: dict[int, dict[str, Any]] = {}
    if workers <= 1:
        for i in order:
            results[i] = execute(specs[i])
            if progress:
                progress(results[i])
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            for i, row in zip(order, pool.imap(execute, [specs[i] for i in order]), strict=True):
                results[i] = row
                if progress:
                    progress(row)
    return [results[i] for i in range(len(specs))]


def _cost_hint(spec: RunSpec) -> float:
    batch = float(spec.workload_params.get("batch", 1))
    weight = {"coding": 3.0, "swe": 3.0, "deepsearch": 1.5, "mopd": 0.6}[spec.workload]
    return batch * weight * (2.0 if spec.policy == "elastic" else 1.0)


def mopd_deployments(params: dict[str, Any], replica_devices: int | None = None) -> dict[str, tuple[int, int]]:
    """Each teacher's dedicated GPUs (PAPER: 4), split into replicas of ``replica_devices``
    (default: one replica over all of them)."""
    p = MopdParams(**params)
    size = replica_devices or p.devices_per_teacher
    return {name: (p.devices_per_teacher // size, size) for name in teacher_names(p)}
