"""Shell: the embedded system: controller, local node agent and managers in this process.

``EmbeddedRuntime.start(config)`` builds what this machine offers: the CPU manager on its
real cores and NUMA layout, the API-quota manager for the configured providers, and the GPU
manager (CUDA devices, else CPU devices with a memory budget) once the first service is
registered, since importing torch costs seconds a CPU-only rollout should not pay.
Blocking set-up (cgroups, model loading) runs on worker threads, never on the event loop.
With a journal (``[service] journal_path``), the actions a previous process left unfinished
get their outcomes once the configured services are registered (``Controller.resume``).
Tenant weights (``[tenants.*] weight``) go to the core's fair share through the cluster spec.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from pathlib import Path
from typing import Any

from arl_tangram.agent.node import NodeAgent, check_replica_fits
from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.topology import ClusterSpec
from arl_tangram.managers.api.manager import ApiManager
from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.runtime.config import ServiceConfig, TangramConfig, quota_pools
from arl_tangram.runtime.config_images import make_image_store, open_snapshots, snapshot_settings
from arl_tangram.runtime.controller import Controller

log = logging.getLogger(__name__)
LOCAL_NODE = "local"


class EmbeddedRuntime:
    """One process, one node. Use ``await EmbeddedRuntime.start(...)`` and ``await aclose()``."""

    def __init__(self, config: TangramConfig, agent: NodeAgent, controller: Controller) -> None:
        self.config = config
        self.agent = agent
        self.controller = controller
        self._gpu_lock = asyncio.Lock()

    @classmethod
    async def start(
        cls, config: TangramConfig | None = None, *, cpu_config: CpuManagerConfig | None = None,
        node_mem_bytes: int | None = None, memory_pause: bool | None = None,
    ) -> EmbeddedRuntime:  # fmt: skip
        """``node_mem_bytes``: the memory sandboxes may hold in all (default: a share of
        this host's); ``memory_pause``: pause-and-grow on (issue 21; None: the policy's
        ``[scheduler.params] memory_pause``, on by default)."""
        config = config or TangramConfig()
        cpu_config = cpu_config or CpuManagerConfig(
            pool_size=config.cpu.pool_size,
            default_spec=SandboxSpec(config.cpu.mem_bytes, config.cpu.pids_max, config.cpu.workspace_bytes, config.cpu.tmp_bytes),
            kill_grace_s=config.cpu.kill_grace_s,
        )  # fmt: skip
        cpu = await asyncio.to_thread(CpuManager, cpu_config)
        api = ApiManager(config.providers) if config.providers else None
        agent = NodeAgent(LOCAL_NODE, cpu=cpu, api=api)
        node_mem_bytes = node_mem_bytes if node_mem_bytes is not None else config.cpu.node_mem_bytes
        if node_mem_bytes is not None:  # the whole of it is the sandboxes'
            agent.host_mem_bytes, agent.sandbox_memory_share = node_mem_bytes, 1.0
        if config.images is not None:
            try:
                agent.images = await asyncio.to_thread(make_image_store, config.images)
            except BaseException:
                await asyncio.to_thread(cpu.close)
                raise
            agent.max_concurrent_pulls = config.images.max_concurrent_pulls
            agent.snapshots = await asyncio.to_thread(open_snapshots, config.images, agent.images)
        policy = config.scheduler.make_policy()
        if memory_pause is None:
            memory_pause = bool(getattr(policy, "memory_pause", True))
        controller = Controller(
            Scheduler(policy), [agent], cluster=cluster_spec(config),
            settings=config.service, tenants=config.tenants,
        )  # fmt: skip
        controller.snapshots.settings = snapshot_settings(config.images)
        if config.images is not None:
            controller.image_aliases = config.images.aliases
        runtime = cls(config, agent, controller)
        try:
            await controller.start()
            assert controller.executor is not None
            controller.executor.memory_pause = memory_pause
            for service in config.services:
                await runtime.register_service(service)
            controller.resume()
        except BaseException:
            await runtime.aclose()
            raise
        return runtime

    async def aclose(self) -> None:
        """End every unfinished action (``cancelled``), then close the managers. Idempotent."""
        await self.controller.aclose()
        agent = self.agent
        if agent.api is not None:
            await agent.api.aclose()
        if agent.gpu is not None:
            await asyncio.to_thread(agent.gpu.close)
        if agent.cpu is not None:
            await asyncio.to_thread(agent.cpu.close)

    async def _ensure_gpu(self) -> None:
        async with self._gpu_lock:
            if self.agent.gpu is not None:
                return
            self.agent.gpu = await asyncio.to_thread(_make_gpu_manager, self.config)
            self.controller.join(self.agent)

    async def register_service(self, service: ServiceConfig) -> ServiceSpec:
        """Register a model service (initialised once, backed up in host memory) and make it
        schedulable. Raises the GPU manager's error naming the field on bad input."""
        await self._ensure_gpu()
        gpu = self.agent.gpu
        assert gpu is not None
        kv = kv_config(service)
        if service.folder is not None:
            info = await asyncio.to_thread(gpu.register_folder, service.name, Path(service.folder), service.handler, kv)
            _check_loaded(info, "folder", service.folder)
        elif service.module is not None:
            # imported and called on a worker thread: an import's or a factory's time
            # never stalls the loop (and ``module`` is an operator's: config or allowlist)
            factory = await asyncio.to_thread(_import_factory, service.module)
            info = await asyncio.to_thread(gpu.register_module, service.name, factory, service.handler, kv)
            _check_loaded(info, "module", service.module)
        check_replica_fits(gpu, service.name, service.devices_min, service.devices_max)
        spec = self.agent.service_spec(service.name, service.devices_min, service.devices_max)
        self.controller.register_service(spec)
        return spec


def cluster_spec(config: TangramConfig) -> ClusterSpec:
    """The core's initial cluster: one quota pool per provider and each configured tenant's
    fair-share weight (nodes join as their agents do)."""
    weights = {name: t.weight for name, t in sorted(config.tenants.items())}
    return ClusterSpec(quota_pools=quota_pools(config), tenant_weights=weights)


def kv_config(service: ServiceConfig) -> Any:
    """A ``generate`` service's KV cache sizing (``managers/gpu/kv.py``); None for others."""
    if service.handler != "generate":
        return None
    from arl_tangram.managers.gpu.kv import DEFAULT_MAX_BATCH, KvCacheConfig

    return KvCacheConfig(service.max_batch or DEFAULT_MAX_BATCH, service.max_context_tokens)


def _make_gpu_manager(config: TangramConfig) -> Any:
    from arl_tangram.managers.gpu.devices import discover_devices
    from arl_tangram.managers.gpu.manager import GpuManager

    gpu = config.gpu
    if gpu.devices == "auto":
        devices = discover_devices(cpu_mem_bytes=(gpu.device_mem_bytes,), cuda_mem_fraction=gpu.mem_fraction)
    else:
        devices = discover_devices(cpu_mem_bytes=(gpu.device_mem_bytes,) * int(gpu.devices), use_cuda=False)
    return GpuManager(devices)


def _check_loaded(info: Any, field: str, source: str) -> None:
    """A loader that raised left the service ``failed`` (the GPU manager caught it): the
    registration ends as the caller's error, naming the source, and is not scheduled."""
    if getattr(info, "error", None):
        raise SpecError(field, f"must load a model (loading it failed: {info.error})", source)


def _import_factory(path: str) -> Any:
    """``pkg.module:factory`` -> the factory callable."""
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)
