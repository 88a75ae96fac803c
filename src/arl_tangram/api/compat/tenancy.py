"""Shell: who is calling on the compat faces, and the compat state kept beside ``ApiState``.

The native API's rule, applied to each face's own credential: with no tokens configured
every call is tenant ``default``; once tokens are configured a call needs a known one.
SandboxFusion clients send no credential, so that face takes the token from the path
(``/t/<token>/run_code``); without one it serves only an unauthenticated server's
``default`` tenant. OpenAI clients send ``Authorization: Bearer``; SWE-ReX ``X-API-Key``.
Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from arl_tangram.api.compat.long_programs import LongPrograms
from arl_tangram.api.compat.pool import CodeEnvPool
from arl_tangram.api.compat.retries import RetryMemory
from arl_tangram.api.state import DEFAULT_TENANT, ApiState
from arl_tangram.runtime.config_sandboxfusion import DEFAULT_MAX_ENVS, DEFAULT_MAX_IDLE


class Unauthorized(PermissionError):
    """No known credential: each face answers it in its own error shape (401)."""


@dataclass
class CompatSettings:
    """Knobs of the faces, set by ``mount_compat``."""

    max_envs: int = DEFAULT_MAX_ENVS  # live code sandboxes per (tenant, memory size)
    max_idle: int = DEFAULT_MAX_IDLE  # warm ones kept per (tenant, memory size)
    acquire_timeout_s: float = 60.0  # a code run waits this long for a sandbox, then 504
    default_mem_bytes: int = 1 << 30  # a code run's sandbox when memory_limit_MB <= 0
    warm_envs: int = 0  # created per tenant at start, at ``default_mem_bytes`` (``CodeEnvPool.prewarm``)


@dataclass
class CompatState:
    """What the faces keep while the server runs: the code pool and SWE-ReX's per-env state."""

    api: ApiState
    settings: CompatSettings
    pool: CodeEnvPool
    swerex_envs: dict[str, Any] = field(default_factory=dict)  # internal env id -> its SWE-ReX state
    retries: RetryMemory = field(default_factory=RetryMemory)  # SandboxFusion calls answered 504 lately
    long_programs: LongPrograms = field(default_factory=LongPrograms)  # SandboxFusion programs' probes

    def __post_init__(self) -> None:
        self.long_programs.on_change = self.pool.recheck_probing  # a probe's end lets its siblings go

    async def aclose(self) -> None:
        """Release the pool's envs; SWE-ReX's envs belong to whoever created them."""
        await self.pool.aclose()
        self.swerex_envs.clear()


def compat_state(request: Request) -> CompatState:
    state: CompatState = request.app.state.compat
    return state


def tenant_for(state: ApiState, token: str | None) -> str:
    """The tenant of ``token`` (``None``: no credential given); ``Unauthorized`` otherwise."""
    if not state.tokens:
        if token is None or token == "":
            return DEFAULT_TENANT
        raise Unauthorized("this server has no tokens: call it without one")
    if not token:
        raise Unauthorized("a token is required: this server has tokens configured")
    found = None
    for known, tenant in state.tokens.items():  # every token compared: the time says nothing
        if hmac.compare_digest(known.encode(), token.encode()):
            found = tenant
    if found is None:
        raise Unauthorized("the token is not valid")
    return found
