"""Fixtures of the HTTP service tests: anyio on asyncio, a host that can run real sandboxes,
and servers: ``create_app`` under uvicorn on a free loopback port in a thread with its own
event loop and embedded runtime, stopped (every sandbox destroyed) when the test ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.client.conftest import serving


@pytest.fixture
def server(sandbox_host: None) -> Iterator[ServerThread]:
    with serving() as s:
        yield s


@pytest.fixture
async def http(server: ServerThread) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        yield client


def controller(server: ServerThread) -> Any:
    """The server's controller (read from the test's thread: counts and ids only)."""
    return server.app.state.api.controller
