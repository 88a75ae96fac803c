"""Shell: a SWE-ReX deployment on ARL-Tangram (optional extra: needs ``swe-rex``):
``TangramDeployment`` creates an env and hands back SWE-ReX's own ``RemoteRuntime`` on the
env's base URL (``<server>/swerex/<env_id>``), so SWE-agent / ROCK code drives it unchanged.

``start`` creates the env (one sandbox, zero CPU while idle; every command is an action the
server schedules); ``stop`` closes the runtime's sessions and releases the env; the server's
lease reclaims an env whose deployment died without ``stop``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import IsAliveResponse
from swerex.runtime.remote import RemoteRuntime
from swerex.utils.log import get_logger

from arl_tangram.client import AsyncClient, Env, connect


class TangramDeploymentConfig(BaseModel):
    """Config of a ``TangramDeployment`` (SWE-ReX's config style: ``get_deployment()``)."""

    url: str
    token: str = ""
    memory: str = "2GiB"

    def get_deployment(self) -> TangramDeployment:
        return TangramDeployment(url=self.url, token=self.token, memory=self.memory)


class TangramDeployment(AbstractDeployment):
    def __init__(self, *, url: str, token: str = "", memory: str = "2GiB", **_: Any) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url: must be the http(s) URL of an ARL-Tangram server (got {url!r})")
        self.url = url.rstrip("/")
        self.token = token
        self.memory = memory
        self.logger = get_logger("tangram-deploy")
        self._hooks = CombinedDeploymentHook()
        self._client: AsyncClient | None = None
        self._env: Env | None = None
        self._runtime: RemoteRuntime | None = None

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def runtime(self) -> RemoteRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Create the env and the runtime on its base URL. Idempotent while started."""
        if self._runtime is not None:
            return
        self._hooks.on_custom_step("Creating an ARL-Tangram environment")
        self._client = await connect(self.url, token=self.token or None)
        self._env = await self._client.create_env(memory=self.memory)
        self._runtime = RemoteRuntime(host=f"{self.url}/swerex/{self._env.env_id}", port=None, auth_token=self.token)

    async def stop(self) -> None:
        """Close the runtime's sessions and release the env. Idempotent."""
        runtime, env, client = self._runtime, self._env, self._client
        self._runtime = self._env = self._client = None
        try:
            if runtime is not None:
                await runtime.close()
        finally:
            if env is not None:
                await env.release()
            if client is not None:
                await client.aclose()
