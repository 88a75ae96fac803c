"""Core: the shape of the cluster (nodes, NUMA domains, GPU nodes, API quota pools, services).

Specs are immutable descriptions; the free amounts live in ``state.ClusterState``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from arl_tangram.core.action import ActionSpec, ServiceSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind

GPU_NODE_DEVICES = 8


@dataclass(frozen=True)
class CpuNodeSpec:
    """A CPU node: ``numa_cores[d]`` cores in NUMA domain d; memory in bytes.
    ``max_concurrent_pulls``: image pulls the node runs at once (more wait in the core);
    ``pull_bytes_per_s``: the prior for its pull+unpack bandwidth, until pulls measure it."""

    node_id: str
    numa_cores: tuple[int, ...]
    mem_bytes: int
    max_concurrent_pulls: int = 4
    pull_bytes_per_s: float = 100e6

    def __post_init__(self) -> None:
        if not self.numa_cores or any(c <= 0 for c in self.numa_cores):
            raise SpecError(f"cpu_nodes[{self.node_id}].numa_cores", "must be positive core counts", self.numa_cores)
        if self.mem_bytes <= 0:
            raise SpecError(f"cpu_nodes[{self.node_id}].mem_bytes", "must be > 0", self.mem_bytes)
        if not isinstance(self.max_concurrent_pulls, int) or self.max_concurrent_pulls < 1:
            raise SpecError(f"cpu_nodes[{self.node_id}].max_concurrent_pulls", "must be an integer >= 1", self.max_concurrent_pulls)
        if not math.isfinite(self.pull_bytes_per_s) or self.pull_bytes_per_s <= 0:
            raise SpecError(f"cpu_nodes[{self.node_id}].pull_bytes_per_s", "must be finite and > 0", self.pull_bytes_per_s)

    @property
    def millicores(self) -> int:
        return sum(self.numa_cores) * MILLICORES_PER_CORE


@dataclass(frozen=True)
class GpuNodeSpec:
    """A GPU node of ``devices`` devices (8 on the paper's Hopper nodes) linked by NVLink."""

    node_id: str
    devices: int = GPU_NODE_DEVICES
    device_mem_bytes: int = 80 << 30

    def __post_init__(self) -> None:
        if self.devices not in (1, 2, 4, 8):
            raise SpecError(f"gpu_nodes[{self.node_id}].devices", "must be 1, 2, 4 or 8", self.devices)


@dataclass(frozen=True)
class QuotaPoolSpec:
    """An API provider's limits: concurrent requests and requests per second."""

    provider: str
    max_concurrency: int
    rate_per_s: float

    def __post_init__(self) -> None:
        if self.max_concurrency <= 0:
            raise SpecError(f"quota_pools[{self.provider}].max_concurrency", "must be > 0", self.max_concurrency)
        if not math.isfinite(self.rate_per_s) or self.rate_per_s <= 0:
            raise SpecError(f"quota_pools[{self.provider}].rate_per_s", "must be finite and > 0", self.rate_per_s)


@dataclass(frozen=True)
class ClusterSpec:
    cpu_nodes: tuple[CpuNodeSpec, ...] = ()
    gpu_nodes: tuple[GpuNodeSpec, ...] = ()
    quota_pools: tuple[QuotaPoolSpec, ...] = ()
    services: Mapping[str, ServiceSpec] = field(default_factory=dict)
    # tenant -> weight of its fair share under contention; a tenant not listed weighs 1.0
    tenant_weights: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for tenant, weight in self.tenant_weights.items():
            if not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
                raise SpecError(f"tenant_weights[{tenant}]", "must be a finite number > 0", weight)
        for name, nodes in (("cpu_nodes", self.cpu_nodes), ("gpu_nodes", self.gpu_nodes)):
            ids = [n.node_id for n in nodes]
            if len(set(ids)) != len(ids):
                raise SpecError(name, "node ids must be unique", ids)
        for name, service in self.services.items():
            if name != service.name:
                raise SpecError(f"services[{name}]", "key must equal the service's name", service.name)

    def without_node(self, node_id: str) -> ClusterSpec:
        """This cluster less the node ``node_id`` (unchanged if it has no such node)."""
        return replace(
            self,
            cpu_nodes=tuple(n for n in self.cpu_nodes if n.node_id != node_id),
            gpu_nodes=tuple(n for n in self.gpu_nodes if n.node_id != node_id),
        )

    def weight_of(self, tenant: str) -> float:
        """The tenant's fair-share weight (1.0 unless configured)."""
        return float(self.tenant_weights.get(tenant, 1.0))

    def quota_pool(self, provider: str) -> QuotaPoolSpec | None:
        for pool in self.quota_pools:
            if pool.provider == provider:
                return pool
        return None


def add_node(cluster: ClusterSpec, node: CpuNodeSpec | GpuNodeSpec) -> ClusterSpec:
    """``cluster`` with ``node`` added; ``SpecError`` if a node of that id exists."""
    known = {n.node_id for n in cluster.cpu_nodes} | {n.node_id for n in cluster.gpu_nodes}
    if node.node_id in known:
        raise SpecError("node.node_id", "must be unique in the cluster", node.node_id)
    if isinstance(node, CpuNodeSpec):
        return replace(cluster, cpu_nodes=(*cluster.cpu_nodes, node))
    return replace(cluster, gpu_nodes=(*cluster.gpu_nodes, node))


def add_service(cluster: ClusterSpec, service: ServiceSpec) -> ClusterSpec:
    """``cluster`` with ``service`` registered (a re-registration replaces the spec)."""
    return replace(cluster, services={**cluster.services, service.name: service})


def split_numa(cores: int, domains: int) -> tuple[int, ...]:
    """``cores`` spread over ``domains`` NUMA domains as evenly as whole cores allow."""
    per_domain = cores // domains
    return tuple([per_domain] * (domains - 1) + [cores - per_domain * (domains - 1)])


def uniform_cluster(
    num_cpu_nodes: int = 0,
    cores_per_node: int = 256,
    numa_domains: int = 2,
    mem_bytes: int = 2400 << 30,
    num_gpu_nodes: int = 0,
    gpus_per_node: int = GPU_NODE_DEVICES,
    quota_pools: tuple[QuotaPoolSpec, ...] = (),
    services: Mapping[str, ServiceSpec] | None = None,
) -> ClusterSpec:
    """The paper's shape by default: nodes of 256 cores (2 NUMA domains) and 2.4 TB."""
    numa = split_numa(cores_per_node, numa_domains)
    return ClusterSpec(
        cpu_nodes=tuple(CpuNodeSpec(f"cpu-{i:03d}", numa, mem_bytes) for i in range(num_cpu_nodes)),
        gpu_nodes=tuple(GpuNodeSpec(f"gpu-{i:03d}", gpus_per_node) for i in range(num_gpu_nodes)),
        quota_pools=quota_pools,
        services=dict(services or {}),
    )


def check_replica_memory(service: ServiceSpec, cluster: ClusterSpec, lo: int, hi: int) -> None:
    """Raise ``SpecError`` unless some replica size in [lo, hi] fits a GPU node's devices,
    the KV cache of a generating service counted (``ServiceSpec.device_bytes``)."""
    for node in cluster.gpu_nodes:
        size = lo
        while size <= min(hi, node.devices):
            if service.device_bytes(size) <= node.device_mem_bytes:
                return
            size *= 2
    need = service.device_bytes(min(hi, max((n.devices for n in cluster.gpu_nodes), default=1)))
    raise SpecError(
        "binding.name", f"service {service.name!r} needs {need} bytes per device (weights + KV cache "
        f"{service.kv_cache_bytes}); no GPU node's devices hold that", service.name,
    )  # fmt: skip


def check_can_ever_fit(spec: ActionSpec, cluster: ClusterSpec) -> None:
    """Raise ``SpecError`` if no node of ``cluster`` could ever run ``spec`` at ``dop_min``."""
    demand = spec.demand_at(spec.dop_min)
    binding = spec.binding
    if binding.kind == "service":
        service = cluster.services.get(binding.name)
        if service is None:
            raise SpecError("binding.name", "must name a registered service", binding.name)
        largest = max((n.devices for n in cluster.gpu_nodes), default=0)
        lo, hi = max(spec.dop_min, service.devices_min), min(spec.dop_max, service.devices_max)
        if min(lo, service.devices_min) > largest or (lo <= hi and lo > largest):
            raise SpecError("dop_min", f"must fit the largest GPU node ({largest} devices)", lo)
        if lo > hi:
            raise SpecError(
                "dop_min", f"must overlap the service's replica sizes [{service.devices_min}, {service.devices_max}]",
                (spec.dop_min, spec.dop_max),
            )
        check_replica_memory(service, cluster, lo, hi)
        return
    if binding.kind == "api":
        pool = cluster.quota_pool(binding.name)
        if pool is None:
            raise SpecError("binding.name", "must name a configured API provider", binding.name)
        if demand.quota_tokens > pool.max_concurrency:
            raise SpecError("demand.quota", f"must be <= the provider's concurrency {pool.max_concurrency}", demand.quota_tokens)
        return
    if spec.key is ResourceKind.GPU or demand.gpu_devices:
        raise SpecError("key", "GPU demand must be bound to a service", spec.key)
    if not any(
        demand.cpu_millicores <= n.millicores and demand.mem_bytes <= n.mem_bytes for n in cluster.cpu_nodes
    ):
        biggest = max(cluster.cpu_nodes, key=lambda n: (n.millicores, n.mem_bytes), default=None)
        room = f" (the biggest has {biggest.millicores / 1000:g} cores and {biggest.mem_bytes} bytes)" if biggest else " (none is up)"
        asked = f"{demand.cpu_millicores / 1000:g} cores and {demand.mem_bytes} bytes"  # a person reads this: units, no repr
        raise SpecError("demand", f"must fit on at least one CPU node at dop_min{room}", asked)
