"""Shell: the node agent, which owns the managers of one node and reports its real capacity.

Mechanism only: it is told which env, grant, NUMA split, replica and devices to use (by the
controller's decisions) and obeys. Its CPU and GPU calls block (forks, copies, model calls),
so its callers run them on worker threads; its API calls are coroutines. Its managers are
reached through the ports of ``agent.ports``: the managers themselves on this host (the
local backend), or proxies to another host's managers (``backends.ray``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from arl_tangram.agent.ports import ApiPort, CpuPort, GpuPort, ImagePort
from arl_tangram.agent.snapshots import NodeSnapshots
from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.topology import CpuNodeSpec, GpuNodeSpec

# Of the host's memory, what sandboxes may hold in all (the rest: the host, the models' host
# copies, the controller). An assumption; configurable per agent.
DEFAULT_SANDBOX_MEMORY_SHARE = 0.5


@dataclass
class NodeAgent:
    """The managers of one node under the node ids the controller knows them by.
    ``host_mem_bytes``: the node's physical memory; None means this host's (the agent's
    managers are local), a remote backend sets what the node reported. ``images``: the
    node's image store (None: only the host root runs here); ``max_concurrent_pulls`` its
    bound on pulls at once, which the core keeps to when it orders pulls."""

    node_id: str
    cpu: CpuPort | None = None
    gpu: GpuPort | None = None
    api: ApiPort | None = None
    sandbox_memory_share: float = DEFAULT_SANDBOX_MEMORY_SHARE
    host_mem_bytes: int | None = None
    images: ImagePort | None = None
    max_concurrent_pulls: int = 4
    snapshots: NodeSnapshots | None = None  # the image envs' snapshots (local backend only)

    @property
    def cpu_node_id(self) -> str:
        return f"{self.node_id}/cpu"

    @property
    def gpu_node_id(self) -> str:
        return f"{self.node_id}/gpu"

    def cpu_node_spec(self) -> CpuNodeSpec | None:
        """The node's real cores per NUMA domain and the memory sandboxes may hold."""
        if self.cpu is None:
            return None
        numa_cores = self.cpu.numa_cores()
        host = self.host_mem_bytes if self.host_mem_bytes is not None else local_mem_bytes()
        mem_bytes = int(host * self.sandbox_memory_share)
        return CpuNodeSpec(self.cpu_node_id, tuple(numa_cores), mem_bytes, max_concurrent_pulls=self.max_concurrent_pulls)

    def layer_bytes(self) -> dict[str, int]:
        """The image layers this node holds (digest -> unpacked bytes); none without a store."""
        return {} if self.images is None else dict(self.images.layer_bytes())

    def gpu_node_spec(self) -> GpuNodeSpec | None:
        """The node's devices (CUDA, or CPU devices with a memory budget) as one GPU node.
        The core places whole aligned chunks of devices, so a count that is not 1, 2, 4 or
        8 is rounded down to one."""
        if self.gpu is None:
            return None
        capacity = self.gpu.device_capacity_bytes()
        usable = max(n for n in (1, 2, 4, 8) if n <= max(1, len(capacity)))
        return GpuNodeSpec(self.gpu_node_id, usable, min(capacity[:usable]))

    def service_spec(self, name: str, devices_min: int = 1, devices_max: int = 1) -> ServiceSpec:
        """The core's view of a registered service: its weight bytes and replica sizes."""
        if self.gpu is None:
            raise LookupError("this node has no GPU manager")
        info = self.gpu.service_info(name)
        kv = int(getattr(info, "kv_cache_bytes", 0))  # generating services: their batch's KV cache
        batch = int(getattr(info, "max_batch", 1))  # and how many actions share a replica
        return ServiceSpec(name, int(info.weight_bytes), devices_min, devices_max, kv_cache_bytes=kv, max_batch=batch)


def local_mem_bytes() -> int:
    """This host's physical memory."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_replica_fits(gpu: GpuPort, service: str, devices_min: int, devices_max: int, where: str = "") -> None:
    """Refuse a registration at a width where one replica would not fit a device: the core
    places replicas on whole devices, so no placement it makes may then fail for lack of
    memory. ``where`` names the node in the message (multi-node)."""
    capacity = min(gpu.device_capacity_bytes())
    on = f" on {where}" if where else ""
    for width in (1, 2, 4, 8):
        if devices_min <= width <= devices_max:
            need = gpu.footprint_bytes(service, width)
            if need > capacity:
                raise SpecError(
                    "devices_min", f"a replica of {service!r} over {width} device(s) needs {need} bytes per device, "
                    f"more than a device's {capacity}{on}: raise devices_min or the device memory", width,
                )  # fmt: skip
