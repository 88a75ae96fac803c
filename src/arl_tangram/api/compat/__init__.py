"""Shell: the ecosystem faces (SandboxFusion, OpenAI/vLLM, SWE-ReX) mounted on the native app.

``mount_compat(app)`` adds their routers to an app made by ``create_app`` and chains their
state onto its lifespan: created after the runtime starts, closed (warm sandboxes
released, resets in flight awaited) before the runtime closes. Call it once,
before the server starts. Wire formats: ../shared/PROTOCOLS.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from arl_tangram.api.compat import chat, openai_face, sandboxfusion, swerex
from arl_tangram.api.compat.pool import CodeEnvPool
from arl_tangram.api.compat.tenancy import CompatSettings, CompatState
from arl_tangram.runtime.config import ConfigError


def mount_compat(
    app: FastAPI, *, max_envs: int = 16, max_idle: int = 8, acquire_timeout_s: float = 60.0,
    default_mem_bytes: int = 1 << 30,
) -> None:  # fmt: skip
    """Serve the faces on ``app``. ``max_envs`` bounds the live code sandboxes of one
    (tenant, memory size), ``max_idle`` the warm ones kept; a code run waits at most
    ``acquire_timeout_s`` for one (then 504); ``default_mem_bytes`` sizes a run's sandbox
    when the request sets no ``memory_limit_MB``."""
    if getattr(app.state, "compat_mounted", False):
        raise ConfigError("app", "must not have the compat faces mounted twice", app.title)
    for name, value in (("max_envs", max_envs), ("max_idle", max_idle)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(name, "must be an integer >= 1", value)
    settings = CompatSettings(max_envs, max_idle, float(acquire_timeout_s), int(default_mem_bytes))
    app.state.compat_mounted = True
    original = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with original(a) as inner:
            api = a.state.api
            pool = CodeEnvPool(api, max_envs=settings.max_envs, max_idle=settings.max_idle, acquire_timeout_s=settings.acquire_timeout_s)
            compat = CompatState(api, settings, pool)
            a.state.compat = compat
            try:
                yield inner
            finally:
                await compat.aclose()

    app.router.lifespan_context = lifespan
    app.include_router(sandboxfusion.router)
    app.include_router(openai_face.router)
    app.include_router(chat.router)
    app.include_router(swerex.router)


__all__ = ["mount_compat"]
