"""Shell: the E2B face's sandboxes: each one a native env of its tenant, plus what E2B
says about it (template, metadata, envVars, the envd access token, its time to live) and
the commands started in it (``E2bProcess``: a pid the face hands out -> the exec action).

Who calls: the control-plane and envd handlers, on the server's event loop only (no lock).
A sandbox's external id is its env id in the native API too (``GET /v1/envs/<id>`` works).

Timeout vs lease: E2B's ``timeout`` is the sandbox's time to live and wins over the idle
lease: the face renews the env's lease while the sandbox lives (so an idle sandbox is not
reclaimed early) and releases the env when the TTL ends even with work queued or running
(those actions end ``cancelled``, the runtime's rule for a released env); the sandbox is
then reported like an expired lease (404 naming its end). ``set_timeout`` moves the end to
now + the new timeout. A paused sandbox's clock is stopped (E2B keeps paused sandboxes):
``resume``/``connect`` restart it with the timeout they give, else the time that was left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.api.compat.e2b.spares import Spares
from arl_tangram.api.state import ApiState, new_id
from arl_tangram.runtime.actions import ActionRecord
from arl_tangram.runtime.config_e2b import E2bConfig

MAX_GONE_KEPT = 4096  # ended sandboxes remembered, to say why they are gone


@dataclass
class E2bProcess:
    """A command started through envd: its action, and what ``Process.List`` reports."""

    pid: int
    tag: str | None
    cmd: str
    args: tuple[str, ...]
    envs: dict[str, str]
    cwd: str | None
    record: ActionRecord
    stdin: bool = False


@dataclass
class E2bSandbox:
    sandbox_id: str
    tenant: str
    internal: str  # the env's internal id
    template_id: str
    image: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    cpu: tuple[int, int]  # a command's default cores (min, max)
    access_token: str = field(default_factory=lambda: secrets.token_hex(16))
    started_wall_s: float = field(default_factory=time.time)
    end_s: float = 0.0  # monotonic; the TTL's end while running
    left_s: float | None = None  # while paused: what was left of the TTL
    processes: dict[int, E2bProcess] = field(default_factory=dict)
    next_pid: int = 1000
    timer: asyncio.TimerHandle | None = None

    @property
    def paused(self) -> bool:
        return self.left_s is not None

    def end_wall_s(self) -> float:
        left_s = self.left_s if self.left_s is not None else self.end_s - time.monotonic()
        return time.time() + max(0.0, left_s)

    def token_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.access_token.encode())


def new_sandbox_id() -> str:
    """E2B's id shape: a letter and 20 lowercase hex digits, uuid4-based (not guessable)."""
    return "i" + new_id("").replace("-", "")[:20]


class E2bState:
    """Live sandboxes by id, and the last ``MAX_GONE_KEPT`` ended ones with why."""

    def __init__(self, api: ApiState, config: E2bConfig) -> None:
        self.api, self.config = api, config
        self.sandboxes: dict[str, E2bSandbox] = {}
        self.gone: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.snapshots: dict[str, Any] = {}  # snapshot id -> fork.E2bSnapshot
        self.keeper: asyncio.Task[None] | None = None
        self.spares = Spares(api, config.warm, new_sandbox_id)

    def start(self) -> None:
        self.keeper = asyncio.get_running_loop().create_task(self._keep_leases(), name="e2b-leases")

    async def _keep_leases(self) -> None:
        """Renew every live sandbox's lease well inside the idle TTL: its TTL rules instead."""
        period_s = max(0.05, self.api.controller.settings.env_idle_ttl_s / 4)
        while True:
            await asyncio.sleep(period_s)
            self.spares.renew()
            for sb in list(self.sandboxes.values()):
                if sb.internal in self.api.controller.env_specs:
                    self.api.controller.renew_env(sb.internal)
                else:  # released elsewhere (the native API, an expiry, a lost node)
                    self.forget(sb, "was released")

    def add(self, sb: E2bSandbox, timeout_s: float) -> None:
        self.sandboxes[sb.sandbox_id] = sb
        self.arm(sb, timeout_s)

    def arm(self, sb: E2bSandbox, timeout_s: float) -> None:
        """(Re)start the TTL: the sandbox is killed ``timeout_s`` from now."""
        if sb.timer is not None:
            sb.timer.cancel()
        sb.left_s = None
        sb.end_s = time.monotonic() + timeout_s
        sb.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, sb.sandbox_id)

    def pause(self, sb: E2bSandbox) -> None:
        if sb.timer is not None:
            sb.timer.cancel()
            sb.timer = None
        sb.left_s = max(0.0, sb.end_s - time.monotonic())

    def _expire(self, sandbox_id: str) -> None:
        sb = self.sandboxes.get(sandbox_id)
        if sb is not None:
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.kill(sb, f"was killed: its timeout (time to live) ran out at {at}")

    def kill(self, sb: E2bSandbox, why: str) -> None:
        """Release the env (its queued and running commands end ``cancelled``). Idempotent."""
        if sb.internal in self.api.controller.env_specs:
            self.api.sessions.pop(sb.internal, None)
            self.api.controller.release_env(sb.internal)
        self.forget(sb, why)

    def forget(self, sb: E2bSandbox, why: str) -> None:
        if sb.timer is not None:
            sb.timer.cancel()
        self.sandboxes.pop(sb.sandbox_id, None)
        self.gone[sb.sandbox_id] = why
        while len(self.gone) > MAX_GONE_KEPT:
            self.gone.popitem(last=False)

    def of_tenant(self, tenant: str, sandbox_id: str) -> E2bSandbox | None:
        sb = self.sandboxes.get(sandbox_id)
        return sb if sb is not None and sb.tenant == tenant else None

    def why_gone(self, sandbox_id: str) -> str:
        return self.gone.get(sandbox_id, "does not exist")

    def new_pid(self, sb: E2bSandbox) -> int:
        sb.next_pid += 1
        return sb.next_pid

    async def aclose(self) -> None:
        """Kill every sandbox (the runtime destroys what is left anyway) and stop the keeper."""
        if self.keeper is not None:
            self.keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.keeper
        await self.spares.aclose()
        for sb in list(self.sandboxes.values()):
            self.kill(sb, "was killed: the server stopped")


def e2b_state(request: Any) -> E2bState:
    state: E2bState = request.app.state.e2b
    return state
