"""Shell: the SDK's transport seam, and its in-process implementation over the embedded runtime.

``AsyncClient`` speaks only to a ``Transport``; the HTTP transport (a later issue) gives the
same client over the network without touching rollout code. Every method is a coroutine on
the caller's event loop; blocking work (a host-side file call) runs on worker threads.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from arl_tangram.core.action import ActionSpec, EnvSpec, ServiceSpec
from arl_tangram.core.elasticity import Learned
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import ActionResult, Payload, read_result
from arl_tangram.runtime.config import ServiceConfig, TangramConfig
from arl_tangram.runtime.embedded import EmbeddedRuntime
from arl_tangram.runtime.snapshots import public


class Transport(abc.ABC):
    """What a client can ask of an ARL-Tangram deployment."""

    @abc.abstractmethod
    async def run_action(self, spec: ActionSpec, payload: Payload, timeout_s: float | None = None) -> ActionResult:
        """Submit and await the action's one terminal result. Cancelling the awaiting task
        cancels the action (a queued one ends ``cancelled``, a running one is stopped)."""

    @abc.abstractmethod
    async def create_env(self, spec: EnvSpec) -> None: ...

    @abc.abstractmethod
    async def prefetch(self, image: str, nodes: Sequence[str]) -> None:
        """Order ``image`` pulled onto ``nodes`` (all when empty); returns once ordered."""

    @abc.abstractmethod
    async def release_env(self, env_id: str) -> None: ...

    @abc.abstractmethod
    async def write_file(self, env_id: str, path: str, data: bytes) -> None: ...

    @abc.abstractmethod
    async def read_file(self, env_id: str, path: str) -> bytes: ...

    @abc.abstractmethod
    async def open_session(self, env_id: str, env: Mapping[str, str] | None, cwd: str | None) -> str: ...

    @abc.abstractmethod
    async def close_session(self, env_id: str, session_id: str) -> None: ...

    @abc.abstractmethod
    async def register_service(self, service: ServiceConfig) -> ServiceSpec: ...

    # snapshots: each returns the snapshot's JSON record (``runtime.snapshots.public``)
    async def snapshot(self, env_id: str, tenant: str, name: str | None) -> dict[str, Any]:
        raise NotImplementedError

    async def fork(self, env_id: str, tenant: str, count: int) -> list[str]:
        """The children's env ids."""
        raise NotImplementedError

    async def rollback(self, env_id: str, tenant: str, snapshot_id: str) -> dict[str, Any]:
        raise NotImplementedError

    async def get_snapshot(self, snapshot_id: str, tenant: str) -> dict[str, Any]:
        raise NotImplementedError

    async def list_snapshots(self, tenant: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def delete_snapshot(self, snapshot_id: str, tenant: str) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def service_spec(self, name: str) -> ServiceSpec | None: ...

    @abc.abstractmethod
    def has_provider(self, name: str) -> bool: ...

    @abc.abstractmethod
    def learned_model(self, kind: str) -> Learned: ...

    @abc.abstractmethod
    async def aclose(self) -> None: ...


class InProcessTransport(Transport):
    """The embedded system: controller, agent and managers in this process."""

    def __init__(self, runtime: EmbeddedRuntime) -> None:
        self.runtime = runtime
        self.controller = runtime.controller

    @classmethod
    async def start(cls, config: TangramConfig | None = None) -> InProcessTransport:
        return cls(await EmbeddedRuntime.start(config))

    async def run_action(self, spec: ActionSpec, payload: Payload, timeout_s: float | None = None) -> ActionResult:
        record = self.controller.submit(spec, payload)
        try:
            return await asyncio.wait_for(read_result(record), timeout_s)  # held outputs fetched here
        except (asyncio.CancelledError, TimeoutError):
            self.controller.cancel(spec.action_id)
            raise
        finally:
            if record.done.done():
                self.controller.ack(spec.action_id)

    async def create_env(self, spec: EnvSpec) -> None:
        await self.controller.create_env(spec)

    async def prefetch(self, image: str, nodes: Sequence[str]) -> None:
        self.controller.prefetch(image, tuple(nodes))

    async def release_env(self, env_id: str) -> None:
        self.controller.release_env(env_id)

    def _cpu(self, env_id: str):  # type: ignore[no-untyped-def]
        cpu = self.controller.env_node(env_id).cpu
        if cpu is None:
            raise SpecError("env_id", "must name an env on a node with a CPU manager", env_id)
        return cpu

    async def write_file(self, env_id: str, path: str, data: bytes) -> None:
        await asyncio.to_thread(self._cpu(env_id).write_file, env_id, path, data)

    async def read_file(self, env_id: str, path: str) -> bytes:
        data: bytes = await asyncio.to_thread(self._cpu(env_id).read_file, env_id, path)
        return data

    async def open_session(self, env_id: str, env: Mapping[str, str] | None, cwd: str | None) -> str:
        session_id: str = await asyncio.to_thread(self._cpu(env_id).open_session, env_id, env=env, cwd=cwd)
        return session_id

    async def close_session(self, env_id: str, session_id: str) -> None:
        await asyncio.to_thread(self._cpu(env_id).close_session, session_id)

    async def register_service(self, service: ServiceConfig) -> ServiceSpec:
        return await self.runtime.register_service(service)

    async def snapshot(self, env_id: str, tenant: str, name: str | None) -> dict[str, Any]:
        return await self.controller.snapshots.snapshot(env_id, tenant, name)

    async def fork(self, env_id: str, tenant: str, count: int) -> list[str]:
        return [s.env_id for s in await self.controller.snapshots.fork(env_id, tenant, count)]

    async def rollback(self, env_id: str, tenant: str, snapshot_id: str) -> dict[str, Any]:
        return await self.controller.snapshots.rollback(env_id, tenant, snapshot_id)

    async def get_snapshot(self, snapshot_id: str, tenant: str) -> dict[str, Any]:
        return public(await asyncio.to_thread(self.controller.snapshots.get, snapshot_id, tenant))

    async def list_snapshots(self, tenant: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.controller.snapshots.catalog, tenant)

    async def delete_snapshot(self, snapshot_id: str, tenant: str) -> None:
        await asyncio.to_thread(self.controller.snapshots.delete, snapshot_id, tenant)

    def service_spec(self, name: str) -> ServiceSpec | None:
        return self.controller.loop.state.spec.services.get(name)

    def has_provider(self, name: str) -> bool:
        return self.controller.loop.state.spec.quota_pool(name) is not None

    def learned_model(self, kind: str) -> Learned:
        return self.controller.learned_model(kind)

    async def aclose(self) -> None:
        await self.runtime.aclose()
