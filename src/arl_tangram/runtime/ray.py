"""Shell: the multi-node runtime on Ray, wired as the embedded one is (``runtime -> backends``).

``await start_ray_runtime(config, address)`` returns a ``backends.ray.runtime.RayRuntime``
whose controller is made exactly as ``EmbeddedRuntime.start`` makes its own (the config's
policy, quota pools, tenant weights and limits, service settings). ``address``: ``None``
(``RAY_ADDRESS``, else a local Ray offering ARL-Tangram resources), ``"auto"``,
``host:port`` or ``ray://...``. ``ray`` is imported only when this is called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.runtime.config import TangramConfig
from arl_tangram.runtime.controller import Controller
from arl_tangram.runtime.embedded import cluster_spec

if TYPE_CHECKING:
    from arl_tangram.backends.ray.runtime import RayRuntime


def controller_factory(config: TangramConfig) -> Callable[[Sequence[NodeAgent]], Controller]:
    """How the Ray runtime makes its controller over the agents it found."""

    def make(agents: Sequence[NodeAgent]) -> Controller:
        return Controller(
            Scheduler(config.scheduler.make_policy()), agents, cluster=cluster_spec(config),
            settings=config.service, tenants=config.tenants,
        )  # fmt: skip

    return make


async def start_ray_runtime(config: TangramConfig | None = None, address: str | None = None) -> RayRuntime:
    from arl_tangram.backends.ray.runtime import start_ray_runtime as start

    config = config or TangramConfig()
    return await start(config, address, make_controller=controller_factory(config))
