"""Shell: where an adapter's ARL-Tangram is (URL and token from its config), and one client
per event loop, opened on first use.

Adapters are configured by the framework (verl's tool YAML, a deployment config), so they
accept the keys users already have: a SandboxFusion URL (``http://host:8080/run_code``, or
``http://host:8080/t/<token>/run_code`` for a tenant) names the same server, and the token
in its path is the tenant's. Without any URL the embedded runtime runs in this process.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from arl_tangram.client import AsyncClient, SpecError, connect

_COMPAT_SUFFIX = re.compile(r"(/t/(?P<token>[^/]+))?/(run_code|run_jupyter)/?$")


@dataclass(frozen=True)
class Endpoint:
    """A server (``url`` None: the embedded runtime) and the tenant's ``token``."""

    url: str | None = None
    token: str | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Endpoint:
        """From ``tangram_url`` / ``tangram_token`` or, for old SandboxFusion configs,
        ``sandbox_fusion_url`` (its ``/run_code`` and ``/t/<token>`` parts are read off)."""
        url = config.get("tangram_url") or config.get("sandbox_fusion_url")
        token = config.get("tangram_token")
        if url is not None:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise SpecError("tangram_url", "must be an http(s) URL of an ARL-Tangram server", url)
            match = _COMPAT_SUFFIX.search(url)
            if match is not None:
                token = token or match.group("token")
                url = url[: match.start()]
            url = url.rstrip("/")
        return cls(url, token)


class LazyClient:
    """An ``AsyncClient`` on the running event loop, connected on first ``get``; ``aclose``
    closes it. Concurrent first calls share one connection."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._client: AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    async def get(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop, self._client = asyncio.Lock(), loop, None
        async with self._lock:
            if self._client is None:
                self._client = await connect(self.endpoint.url, token=self.endpoint.token)
            return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
