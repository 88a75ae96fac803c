"""Fixtures of the SDK tests: async tests run on asyncio through anyio's pytest plugin, and
need a host that can run real sandboxes (never skipped under CI).

The SDK suite runs over both transports: ``embedded`` (in process) and ``http`` (a real
uvicorn server on a free loopback port, in a thread with its own event loop and its own
embedded runtime, reached through ``connect(url)``). ``connector(config)`` opens a client
of the test's transport; ``controller_of(tg)`` is the controller behind it (for the HTTP
transport, the server's: read-only from the test's thread).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import arl_tangram
from arl_tangram.client import AsyncClient
from arl_tangram.client.transport import InProcessTransport
from arl_tangram.runtime.config import TangramConfig

TRANSPORTS = ("embedded", "http")
_SERVERS: dict[int, Any] = {}  # id(client) -> the ServerThread behind an HTTP client


@contextlib.contextmanager
def serving(config: TangramConfig | None = None, **app_options: Any) -> Iterator[Any]:
    """A server thread running ``create_app(config)``; stopped (runtime closed) on exit."""
    from arl_tangram.api import create_app
    from arl_tangram.api.server import ServerThread

    server = ServerThread(create_app(config, **app_options)).start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def open_client(transport: str, config: TangramConfig | None = None) -> AsyncIterator[AsyncClient]:
    if transport == "embedded":
        async with arl_tangram.connect(config=config) as client:
            yield client
        return
    from arl_tangram.api import create_app
    from arl_tangram.api.server import ServerThread

    server = await asyncio.to_thread(lambda: ServerThread(create_app(config)).start())
    try:
        client = await arl_tangram.connect(server.url)
        _SERVERS[id(client)] = server
        try:
            yield client
        finally:
            await client.aclose()
            _SERVERS.pop(id(client), None)
    finally:
        await asyncio.to_thread(server.stop)


def controller_of(tg: AsyncClient) -> Any:
    if isinstance(tg.transport, InProcessTransport):
        return tg.transport.controller
    return _SERVERS[id(tg)].app.state.api.controller


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def connector(transport: str) -> Callable[..., contextlib.AbstractAsyncContextManager[AsyncClient]]:
    return lambda config=None: open_client(transport, config)


@pytest.fixture
async def tg(transport: str) -> AsyncIterator[AsyncClient]:
    async with open_client(transport) as client:
        yield client
