"""Shell: warm sandboxes for the stateless faces (SandboxFusion), and env actions run for them.

Who calls: the compat route handlers, on the server's (the controller's) event loop. A code
run borrows an env of its tenant and memory size from ``CodeEnvPool``, runs its actions in
it and gives it back; the env is reset (workspace, /tmp and /dev/shm emptied: every
process an action started is already gone, the CPU manager's rule) by one more action
before anyone borrows it again, off the caller's critical path. At most ``max_envs`` envs
of one (tenant, size) exist at once; a borrower beyond that waits for a free one, bounded
by ``acquire_timeout_s`` (then ``Overloaded``, which the faces answer as retryable). An env
that failed its reset, or whose lease the runtime reclaimed, is dropped, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.api.state import ApiState, Overloaded, new_id
from arl_tangram.client.client import ONE_CORE
from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.elasticity import NonElastic
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceKind
from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.runtime.actions import ActionResult, ExecPayload

RESET_COMMAND = "find /workspace /tmp /dev/shm -mindepth 1 -delete 2>/dev/null; exit 0"
RESET_TIMEOUT_S = 30.0


def env_cpu(state: ApiState, env_id: str) -> Any:
    """The CPU manager holding the env's sandbox (host-side file and session calls); typed
    loosely because the agent's view of it (a protocol) is still moving."""
    cpu = state.controller.env_node(env_id).cpu
    if cpu is None:
        raise SpecError("env_id", "must name an env on a node with a CPU manager", env_id)
    return cpu


async def run_env_action(state: ApiState, tenant: str, env_id: str, kind: str, payload: ExecPayload) -> ActionResult:
    """Submit one single-core action on the env (internal id) and await its one result.
    ``Overloaded`` (or the runtime's limit errors) propagate with nothing queued. The
    result is acknowledged here: the caller holds the only copy it needs."""
    spec = ActionSpec(
        state.scoped(tenant, new_id("cx")), kind, Binding("env", env_id), tenant,
        demand_per_unit=ONE_CORE, key=ResourceKind.CPU, dop_min=1, dop_max=1, elasticity=NonElastic(),
        timeout_s=payload.timeout_s,
    )  # fmt: skip
    record = state.submit(spec, payload, None)
    try:
        return await asyncio.shield(record.done)
    except asyncio.CancelledError:
        state.controller.cancel(spec.action_id)  # the caller went away: stop the run
        raise
    finally:
        if record.done.done():
            state.ack(record)


@dataclass
class _Bucket:
    """The envs of one (tenant, mem_bytes): ``idle`` ready to borrow, ``slots`` bounding all."""

    slots: asyncio.Semaphore
    idle: list[str] = field(default_factory=list)


class CodeEnvPool:
    """Borrow (``acquire``) and give back (``release``) warm envs; ``aclose`` releases all."""

    def __init__(self, state: ApiState, *, max_envs: int, max_idle: int, acquire_timeout_s: float) -> None:
        self.state = state
        self.max_envs = max_envs
        self.max_idle = max_idle
        self.acquire_timeout_s = acquire_timeout_s
        self.buckets: dict[tuple[str, int], _Bucket] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def _bucket(self, tenant: str, mem_bytes: int) -> _Bucket:
        key = (tenant, mem_bytes)
        if key not in self.buckets:
            self.buckets[key] = _Bucket(asyncio.Semaphore(self.max_envs))
        return self.buckets[key]

    async def acquire(self, tenant: str, mem_bytes: int) -> str:
        """An env (internal id) for the caller alone until ``release``. Raises ``Overloaded``
        when none frees within ``acquire_timeout_s``; ``EnvFailedError`` if a new one fails."""
        if self.closed:
            raise Overloaded("the service is shutting down", 5.0)
        bucket = self._bucket(tenant, mem_bytes)
        try:
            await asyncio.wait_for(bucket.slots.acquire(), self.acquire_timeout_s)
        except TimeoutError:
            raise Overloaded(f"all {self.max_envs} code sandboxes of this tenant stayed busy", 1.0) from None
        try:
            while bucket.idle:
                env_id = bucket.idle.pop()
                if env_id in self.state.controller.env_specs:  # its lease may have run out
                    self.state.controller.renew_env(env_id)
                    return env_id
            return await self._create(tenant, mem_bytes)
        except BaseException:
            bucket.slots.release()
            raise

    async def _create(self, tenant: str, mem_bytes: int) -> str:
        env_id = self.state.scoped(tenant, new_id("pool"))
        spec = EnvSpec(env_id, mem_bytes, tenant, "")
        sandbox = SandboxSpec(mem_bytes, 512, max(512 << 20, mem_bytes // 2), 256 << 20)
        # Its own task: a caller that goes away does not abandon a half-created env.
        task = self.state.spawn(self.state.controller.create_env(spec, sandbox))
        done, _ = await asyncio.wait((task,), timeout=self.state.create_timeout_s)
        if not done:
            self.state.controller.release_env(env_id)
            raise Overloaded(f"no node could place a code sandbox within {self.state.create_timeout_s:g} s", 5.0)
        task.result()
        return env_id

    def release(self, tenant: str, mem_bytes: int, env_id: str, *, reusable: bool = True) -> None:
        """Give the env back: reset in the background, then idle (or released when the pool
        is full, closing, or the env is not ``reusable``). Never raises."""
        bucket = self._bucket(tenant, mem_bytes)
        if not reusable or self.closed or len(bucket.idle) >= self.max_idle:
            self._drop(env_id)
            bucket.slots.release()
            return
        self._spawn(self._reset(tenant, bucket, env_id))

    async def _reset(self, tenant: str, bucket: _Bucket, env_id: str) -> None:
        try:
            payload = ExecPayload(("bash", "-c", RESET_COMMAND), None, (), None, RESET_TIMEOUT_S)
            result = await run_env_action(self.state, tenant, env_id, "compat:reset", payload)
            if result.ok and not self.closed and env_id in self.state.controller.env_specs:
                bucket.idle.append(env_id)
                return
            self._drop(env_id)
        except Exception:  # a reset that could not even be submitted: never reuse the env
            self._drop(env_id)
        finally:
            bucket.slots.release()

    def _drop(self, env_id: str) -> None:
        if env_id in self.state.controller.env_specs:
            self.state.controller.release_env(env_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def aclose(self) -> None:
        """Wait for resets in flight, then release every idle env. Idempotent."""
        self.closed = True
        if self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self.tasks), timeout=RESET_TIMEOUT_S)
        for bucket in self.buckets.values():
            while bucket.idle:
                self._drop(bucket.idle.pop())
