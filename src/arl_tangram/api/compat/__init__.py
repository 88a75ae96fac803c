"""Shell: the ecosystem faces (SandboxFusion, OpenAI/vLLM, SWE-ReX, E2B) mounted on the native app.

``mount_compat(app)`` adds their routers to an app made by ``create_app`` and chains their
state onto its lifespan: created after the runtime starts, closed (warm sandboxes
released, resets in flight awaited) before the runtime closes. Call it once,
before the server starts. Wire formats: ../shared/PROTOCOLS.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from arl_tangram.api.compat import chat, openai_face, sandboxfusion, swerex
from arl_tangram.api.compat import jupyter as _jupyter  # noqa: F401  (registers /run_jupyter on sandboxfusion.router)
from arl_tangram.api.compat.pool import CodeEnvPool
from arl_tangram.api.compat.tenancy import CompatSettings, CompatState
from arl_tangram.api.state import DEFAULT_TENANT
from arl_tangram.runtime.config import ConfigError, TangramConfig


def mount_compat(
    app: FastAPI, *, max_envs: int | None = None, max_idle: int | None = None, acquire_timeout_s: float = 60.0,
    default_mem_bytes: int = 1 << 30, config: TangramConfig | None = None, warm_envs: int | None = None,
) -> None:  # fmt: skip
    """Serve the faces on ``app``. ``max_envs`` bounds the live code sandboxes of one
    (tenant, memory size), ``max_idle`` the warm ones kept; a code run waits at most
    ``acquire_timeout_s`` for one (then 504); ``default_mem_bytes`` sizes a run's sandbox
    when the request sets no ``memory_limit_MB``. The E2B face (when the ``e2b`` package is
    installed) is served under ``config.e2b.prefix`` (``config``: the one the app's runtime
    runs; its ``[e2b]`` table is read again at start, and must name the same prefix; its
    ``[sandboxfusion]`` ``max_envs``/``max_idle``/``warm_envs`` are the arguments' defaults).
    ``warm_envs`` code sandboxes of ``default_mem_bytes`` are created for each tenant (the
    configured tokens' tenants, else ``default``) before the app's start-up ends, so before
    a server listens (at most ``max_idle``: more would not be kept)."""
    sf = (config or TangramConfig()).sandboxfusion
    max_envs = sf.max_envs if max_envs is None else max_envs
    max_idle = min(sf.max_idle, max_envs) if max_idle is None else max_idle
    warm_envs = min(sf.warm_envs, max_idle) if warm_envs is None else warm_envs
    if getattr(app.state, "compat_mounted", False):
        raise ConfigError("app", "must not have the compat faces mounted twice", app.title)
    for name, value in (("max_envs", max_envs), ("max_idle", max_idle)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(name, "must be an integer >= 1", value)
    if not isinstance(warm_envs, int) or isinstance(warm_envs, bool) or not 0 <= warm_envs <= max_idle:
        raise ConfigError("warm_envs", f"must be an integer from 0 to max_idle ({max_idle})", warm_envs)
    settings = CompatSettings(max_envs, max_idle, float(acquire_timeout_s), int(default_mem_bytes), warm_envs)
    app.state.compat_mounted = True
    app.state.compat_settings = settings  # what the pool will be made with (read by tests and reports)
    e2b_prefix = (config or TangramConfig()).e2b.prefix if _e2b_installed() else None
    original = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with original(a) as inner:
            api = a.state.api
            pool = CodeEnvPool(api, max_envs=settings.max_envs, max_idle=settings.max_idle, acquire_timeout_s=settings.acquire_timeout_s)
            compat = CompatState(api, settings, pool)
            a.state.compat = compat
            e2b = None
            if e2b_prefix is not None:
                from arl_tangram.api.compat.e2b import start_e2b

                if api.runtime.config.e2b.prefix != e2b_prefix:
                    raise ConfigError("e2b.prefix", "must be the one mount_compat was given", api.runtime.config.e2b.prefix)
                e2b = start_e2b(a, api, api.runtime.config.e2b)
            try:
                await _prewarm(pool, api, settings)
                yield inner
            finally:
                if e2b is not None:
                    await e2b.aclose()
                await compat.aclose()

    app.router.lifespan_context = lifespan
    # first in the app's routes: every request is matched against the routes in order, and
    # the SandboxFusion face takes a training run's highest rate (its paths are no /v1 one's)
    before = len(app.router.routes)
    app.include_router(sandboxfusion.router)
    app.router.routes[0:0] = [app.router.routes.pop(before) for _ in range(len(app.router.routes) - before)]
    app.include_router(openai_face.router)
    app.include_router(chat.router)
    app.include_router(swerex.router)
    if e2b_prefix is not None:
        from arl_tangram.api.compat.e2b import include_e2b

        include_e2b(app, e2b_prefix)


async def _prewarm(pool: CodeEnvPool, api: Any, settings: CompatSettings) -> None:
    """Create each tenant's ``warm_envs`` code sandboxes (see ``mount_compat``), saying so:
    a pool of 64 takes seconds to start."""
    if settings.warm_envs <= 0:
        return
    tenants = sorted(set(api.tokens.values())) or [DEFAULT_TENANT]
    started = time.monotonic()
    print(f"arl-tangram: creating {settings.warm_envs} warm code sandbox(es) for each of {len(tenants)} tenant(s)", file=sys.stderr, flush=True)
    made = [await pool.prewarm(t, settings.default_mem_bytes, settings.warm_envs) for t in tenants]
    print(f"arl-tangram: {sum(made)} warm code sandbox(es) ready in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def _e2b_installed() -> bool:
    """The E2B face speaks with the ``e2b`` package's own message classes (an optional extra)."""
    return importlib.util.find_spec("e2b") is not None


__all__ = ["mount_compat"]
