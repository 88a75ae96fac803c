"""Shell: the Ray runtime: one controller in this process over the node agents of a Ray
cluster, the multi-node counterpart of ``runtime.embedded.EmbeddedRuntime``.

``await start_ray_runtime(config, address, make_controller=...)`` connects to Ray (or uses
the connection this process already has), starts an agent on every node offering
ARL-Tangram resources, registers the configured services on the GPU nodes and returns once
their capacity is schedulable; nodes that join later are added, nodes that stop answering
are declared lost (``backends.ray.membership``). It has the embedded runtime's face
(``controller``, ``register_service``, ``aclose``, ``agent``), so the SDK's in-process
transport and the HTTP API serve it unchanged.

The dependency direction is ``runtime -> backends``: this module never imports ``runtime``.
``config`` is a ``runtime.config.TangramConfig`` read by attribute; the controller is made
by the caller's ``make_controller(agents)`` (a ``runtime.controller.Controller`` over the
agents, made as ``runtime.embedded`` makes its own), as the wiring in ``runtime`` does.

The API-quota manager stays here, beside the controller, not on the nodes: quotas and key
pools are cluster-wide (a copy per node would multiply them) and outbound HTTP has no
locality to win.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from arl_tangram.agent.node import NodeAgent, check_replica_fits
from arl_tangram.backends.ray.actor import KEEP_CHILDREN_ENV, GpuSettings
from arl_tangram.backends.ray.membership import RayMembership, RaySettings
from arl_tangram.backends.ray.proxies import RayGpuProxy
from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.managers.api.manager import ApiManager
from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec

log = logging.getLogger(__name__)
CONTROL_NODE = "control"  # the controller's own agent: the API manager, no capacity


class RayRuntime:
    """The controller over a Ray cluster. ``await start_ray_runtime(...)``, ``await aclose()``."""

    def __init__(
        self, config: Any, controller: Any, membership: RayMembership, agent: NodeAgent
    ) -> None:
        self.config = config
        self.controller = controller
        self.membership = membership
        self.agent = agent  # the controller's own (API quota); node agents: ``membership``
        self.services: list[Any] = []  # runtime.config.ServiceConfig, in registration order
        self._services_lock = asyncio.Lock()
        self.report_problems: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._owns_ray = False
        self._closed = False

    async def register_service(self, service: Any) -> ServiceSpec:
        """Register a model service on every GPU node (its folder must exist on each, or its
        module be importable there) and make it schedulable. Nodes that join later get it
        before they join. Raises ``SpecError`` without a GPU node, or the manager's error."""
        async with self._services_lock:  # a GPU node joining meanwhile gets it too
            agents = [a for a in self.membership.live_agents if a.gpu is not None]
            if not agents:
                raise SpecError(
                    "service",
                    "needs a GPU node (a Ray node offering the GPU resource)",
                    service.name,
                )
            await asyncio.gather(*(asyncio.to_thread(_register_on, a, service) for a in agents))
            self.services.append(service)
            spec = await asyncio.to_thread(
                agents[0].service_spec, service.name, service.devices_min, service.devices_max
            )
        self.controller.register_service(spec)
        return spec

    async def _register_known(self, agent: NodeAgent) -> None:
        """The services so far, on a GPU node about to join (membership joins it right
        after, with no await between, so a concurrent ``register_service`` sees it)."""
        async with self._services_lock:
            for service in self.services:
                await asyncio.to_thread(_register_on, agent, service)

    async def aclose(self) -> None:
        """End every unfinished action (``cancelled``), close every node's managers and
        actor, disconnect from Ray if this runtime connected. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.controller.aclose()
        self.report_problems = await self.membership.aclose()
        for problem in self.report_problems:
            log.warning("closing a node agent: %s", problem)
        if self.agent.api is not None:
            await self.agent.api.aclose()
        if self._owns_ray:
            import ray

            await asyncio.to_thread(ray.shutdown)


async def start_ray_runtime(
    config: Any, address: str | None = None, *, make_controller: Callable[[Sequence[NodeAgent]], Any],
    settings: RaySettings | None = None,
) -> RayRuntime:  # fmt: skip
    """Start the controller over the Ray cluster at ``address`` (``"auto"``, ``host:port``,
    ``ray://...``); None: the connection this process has, else ``RAY_ADDRESS``, else a new
    single-node Ray instance that offers ``settings.resource``. Returns once every node
    already offering resources has its agent and the configured services are registered."""
    settings = settings or RaySettings(
        gpu=GpuSettings(config.gpu.devices, config.gpu.device_mem_bytes, config.gpu.mem_fraction)
    )
    owns = await asyncio.to_thread(_connect, address, settings)
    cpu_config = CpuManagerConfig(
        pool_size=config.cpu.pool_size,
        default_spec=SandboxSpec(config.cpu.mem_bytes, config.cpu.pids_max, config.cpu.workspace_bytes, config.cpu.tmp_bytes),
        kill_grace_s=config.cpu.kill_grace_s,
    )  # fmt: skip
    if settings.max_output_bytes is not None:  # outputs stay on their node: a larger cap is cheap
        cpu_config = replace(cpu_config, max_output_bytes=settings.max_output_bytes)
    control = NodeAgent(
        CONTROL_NODE, api=ApiManager(config.providers) if config.providers else None
    )
    controller = make_controller([control])
    membership = RayMembership(controller, settings, cpu_config)
    runtime = RayRuntime(config, controller, membership, control)
    runtime._owns_ray = owns
    membership.register = runtime._register_known
    try:
        await controller.start()
        await membership.discover()
        runtime._task = asyncio.get_running_loop().create_task(
            membership.run(), name="tangram-ray-membership"
        )
        for service in config.services:
            await runtime.register_service(service)
        controller.resume()  # the journal's unfinished actions, now their services exist
    except BaseException:
        await runtime.aclose()
        raise
    return runtime


def _connect(address: str | None, settings: RaySettings) -> bool:
    """Connect this process to Ray; True when this call did (and ``aclose`` disconnects)."""
    import ray

    if ray.is_initialized():
        return False
    if address is None and not os.environ.get("RAY_ADDRESS"):
        os.environ.update(KEEP_CHILDREN_ENV)  # the local node's workers spare the keepers
        ray.init(resources={settings.resource: 1}, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    return True


def _register_on(agent: NodeAgent, service: Any) -> None:
    """Register ``service`` on one GPU node and refuse a width at which a replica would not
    fit a device there (as the embedded runtime does)."""
    gpu = agent.gpu
    assert isinstance(gpu, RayGpuProxy)
    if (service.folder is None) == (service.module is None):
        raise SpecError("folder", "exactly one of folder or module must be set", service.name)
    info = gpu.register(service.name, service.handler, service.folder, service.module)
    if getattr(info, "error", None):
        raise SpecError(
            "service", f"failed to initialise on {agent.node_id}: {info.error}", service.name
        )
    check_replica_fits(gpu, service.name, service.devices_min, service.devices_max, agent.node_id)
