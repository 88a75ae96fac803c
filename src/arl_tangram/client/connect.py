"""Shell: ``connect()``, the SDK's entry point, and the synchronous ``Client`` beside it.

``async with arl_tangram.connect() as tg`` starts the embedded system (controller, local
backend, managers) in this process with no configuration; ``connect(config="tangram.toml")``
uses a configuration file. A URL (``connect("http://host:8080", token=...)``) selects the
remote transport: the same client over the server's ``/v1`` API, where the server derives
the tenant from the token (``tenant`` is then only a local label).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Generator
from pathlib import Path
from typing import Any, TypeVar

from arl_tangram.client.client import AsyncClient, Env
from arl_tangram.client.http_transport import HttpTransport
from arl_tangram.client.snapshot import Snapshot
from arl_tangram.client.transport import InProcessTransport, Transport
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import ActionResult
from arl_tangram.runtime.config import TangramConfig, load_config

T = TypeVar("T")


class Connection:
    """Awaitable (``tg = await connect()``) and an async context manager (closes on exit)."""

    def __init__(self, url: str | None, config: TangramConfig | str | Path | None, tenant: str, token: str | None = None) -> None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise SpecError("url", "must start with http:// or https:// (or be None: the embedded system)", url)
        if url is not None and config is not None:
            raise SpecError("config", "configures the embedded system: give a url or a config, not both", url)
        if url is None and token is not None:
            raise SpecError("token", "is for a remote server: give it with a url", "<hidden>")
        self.url = url
        self.token = token
        self.config = config if isinstance(config, TangramConfig) or config is None else load_config(config)
        self.tenant = tenant
        self.client: AsyncClient | None = None

    async def _open(self) -> AsyncClient:
        transport: Transport
        if self.url is not None:
            transport = await HttpTransport.connect(self.url, self.token)
        else:
            transport = await InProcessTransport.start(self.config)
        self.client = AsyncClient(transport, tenant=self.tenant)
        return self.client

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncClient:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.aclose()


def connect(
    url: str | None = None, *, config: TangramConfig | str | Path | None = None, tenant: str = "default",
    token: str | None = None,
) -> Connection:  # fmt: skip
    """Connect to ARL-Tangram: embedded in this process when ``url`` is None, else the
    server at ``url`` with the API ``token`` (needed once the server has tokens)."""
    return Connection(url, config, tenant, token)


class Client:
    """The synchronous SDK: the same calls as ``AsyncClient``, for code without an event
    loop. It runs one in a background thread; ``close()`` (or ``with``) stops it."""

    def __init__(
        self, url: str | None = None, *, config: TangramConfig | str | Path | None = None, tenant: str = "default",
        token: str | None = None,
    ) -> None:  # fmt: skip
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tangram-client", daemon=True)
        self._thread.start()
        try:
            self._client: AsyncClient = self._run(connect(url, config=config, tenant=tenant, token=token)._open())
        except BaseException:
            self._stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.aclose())
        self._stop()

    def _stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    def create_env(self, **kwargs: Any) -> SyncEnv:
        return SyncEnv(self, self._run(self._client.create_env(**kwargs)))

    def call(self, name: str, request: Any, **kwargs: Any) -> ActionResult:
        return self._run(self._client.call(name, request, **kwargs))

    def ping(self) -> ActionResult:
        return self._run(self._client.ping())

    def register_service(self, name: str, **kwargs: Any) -> None:
        self._run(self._client.register_service(name, **kwargs))

    def list_snapshots(self) -> list[Snapshot]:
        return self._run(self._client.list_snapshots())

    def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        self._run(self._client.delete_snapshot(snapshot))


class SyncEnv:
    """``Env`` for the synchronous client."""

    def __init__(self, client: Client, env: Env) -> None:
        self._client = client
        self.env = env
        self.env_id = env.env_id

    def __enter__(self) -> SyncEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def exec(self, command: str | list[str], **kwargs: Any) -> ActionResult:
        return self._client._run(self.env.exec(command, **kwargs))

    def write_file(self, path: str, data: bytes | str) -> None:
        self._client._run(self.env.write_file(path, data))

    def read_file(self, path: str) -> bytes:
        return self._client._run(self.env.read_file(path))

    def snapshot(self, name: str | None = None) -> Snapshot:
        return self._client._run(self.env.snapshot(name))

    def fork(self, n: int) -> list[SyncEnv]:
        return [SyncEnv(self._client, e) for e in self._client._run(self.env.fork(n))]

    def rollback(self, snapshot: Snapshot | str) -> None:
        self._client._run(self.env.rollback(snapshot))

    def release(self) -> None:
        self._client._run(self.env.release())
