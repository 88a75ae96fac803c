"""Shell: warm sandboxes for the stateless faces (SandboxFusion), and env actions run for them.

Who calls: the compat route handlers, on the server's (the controller's) event loop. A code
run borrows an env of its tenant and memory size from ``CodeEnvPool``, runs its actions in
it and gives it back; the env is reset (workspace, /tmp and /dev/shm emptied: every
process an action started is already gone, the CPU manager's rule) from the host side by
its node's CPU manager (``CpuManager.empty_dirs``: no program runs), before anyone borrows
it again and off the caller's critical path. The reset is pool housekeeping, not a
scheduled action. At most
``max_envs`` envs of one (tenant, size) exist at once; a borrower beyond that waits for a
free one, in line (a returned env is handed to the oldest waiter; no lock: the pool runs on
one event loop), bounded by ``acquire_timeout_s`` (then ``Overloaded``, which the faces
answer as retryable). Retries go first; a borrower whose program is known to run long, or
is being probed by another call, is held back (``pool_lines``, ``compat.long_programs``).
An env
that failed its reset, or whose lease the runtime reclaimed, is dropped, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.api.compat.pool_lines import HOLD_MARGIN_S, Lines, Turn
from arl_tangram.api.state import ApiState, Overloaded, new_id
from arl_tangram.client.client import ONE_CORE
from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.elasticity import NonElastic
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceKind
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ExecPayload, read_result

#: the writable places a reset empties (``CpuManager.empty_dirs``, from the host side): a
#: sandbox that cannot be emptied (a directory the run made unwritable...) is retired (the
#: next borrower gets a new one), so a dirty sandbox never goes back to the pool
RESET_DIRS = ("/workspace", "/tmp", "/dev/shm")
RESET_WAIT_S = 30.0  # ``aclose`` waits this long for resets in flight
#: how long a cancelled caller waits for its action to end before giving its env up as
#: dirty (a cancel ends a run in tens of milliseconds: freeze, kill, reap)
SETTLE_S = 5.0
log = logging.getLogger(__name__)


def env_cpu(state: ApiState, env_id: str) -> Any:
    """The CPU manager holding the env's sandbox (host-side file and session calls); typed
    loosely because the agent's view of it (a protocol) is still moving."""
    cpu = state.controller.env_node(env_id).cpu
    if cpu is None:
        raise SpecError("env_id", "must name an env on a node with a CPU manager", env_id)
    return cpu


class ActionCancelled(asyncio.CancelledError):
    """The caller was cancelled while its action was queued or ran, and the action has
    ended since (cancelled: its processes are gone), so its env is as clean as after any
    run and may be reset and reused (``run_env_action(settle=True)``)."""


async def run_env_action(
    state: ApiState, tenant: str, env_id: str, kind: str, payload: ExecPayload, deadline_s: float | None = None,
    *, settle: bool = False, watch: Callable[[ActionRecord], None] | None = None, t_ori_s: float | None = None,
) -> ActionResult:  # fmt: skip
    """Submit one single-core action on the env (internal id) and await its one result
    (``deadline_s``: the caller's, ``ActionSpec.deadline_s``; ``watch`` is given the
    action's record once it is submitted; ``t_ori_s``: its expected run, when the caller
    knows it, ``ActionSpec.t_ori_s``).
    ``Overloaded`` (or the runtime's limit errors) propagate with nothing queued. The
    result is acknowledged here: the caller holds the only copy it needs. A caller
    cancelled meanwhile cancels the action; with ``settle`` it then waits (up to
    ``SETTLE_S``) for the action to end and raises ``ActionCancelled`` when it did."""
    spec = ActionSpec(
        state.scoped(tenant, new_id("cx")), kind, Binding("env", env_id), tenant,
        demand_per_unit=ONE_CORE, key=ResourceKind.CPU, dop_min=1, dop_max=1, elasticity=NonElastic(),
        timeout_s=payload.timeout_s, deadline_s=deadline_s, t_ori_s=t_ori_s,
    )  # fmt: skip
    record = state.submit(spec, payload, None)
    if watch is not None:
        watch(record)
    try:
        return await read_result(record)  # held outputs (Ray) fetched for this read
    except asyncio.CancelledError:
        state.controller.cancel(spec.action_id)  # the caller went away: stop the run
        if settle and await _ended(record.done):
            raise ActionCancelled() from None
        raise
    finally:
        if record.done.done():
            state.ack(record)


async def _ended(done: asyncio.Future[Any]) -> bool:
    """Whether ``done`` resolves within ``SETTLE_S`` (it is not cancelled by the wait)."""
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(done), SETTLE_S)
    return done.done()


@dataclass
class _Bucket:
    """The envs of one (tenant, mem_bytes, image): ``idle`` ready to borrow, ``live`` counting all
    (idle, borrowed, resetting, being created); ``lines``: the borrowers waiting
    (``pool_lines``)."""

    lines: Lines = field(default_factory=Lines)
    idle: list[str] = field(default_factory=list)
    live: int = 0
    used_s: float = 0.0  # last borrow or return, for evicting the least recently used idle env


class CodeEnvPool:
    """Borrow (``acquire``) and give back (``release``) warm envs; ``aclose`` releases all.

    A new env is created only while the nodes have the memory for it (counting every env
    the controller holds), after evicting idle envs of other buckets, least recently used
    first; otherwise a borrower waits for one of its bucket's envs to come back. A bucket
    with no env at all creates one anyway (the controller queues it until memory frees);
    while such a creation waits, envs that come back are released instead of kept idle, so
    the pool never holds the memory it is waiting for."""

    def __init__(self, state: ApiState, *, max_envs: int, max_idle: int, acquire_timeout_s: float) -> None:
        self.state = state
        self.max_envs = max_envs
        self.max_idle = max_idle
        self.acquire_timeout_s = acquire_timeout_s
        self.buckets: dict[tuple[str, int, str], _Bucket] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.creating: dict[str, int] = {}  # env id -> memory, from the decision until the controller holds it
        self.starved: set[str] = set()  # creations that started without the memory for them
        self.closed = False
        # a stop wakes borrowers waiting for a full bucket: they end now, not at their timeout
        state.stopping.add_done_callback(lambda _f: self._spawn(self._wake_all()))

    def _bucket(self, tenant: str, mem_bytes: int, image: str = "host") -> _Bucket:
        key = (tenant, mem_bytes, image)
        if key not in self.buckets:
            self.buckets[key] = _Bucket()
        return self.buckets[key]

    async def acquire(
        self, tenant: str, mem_bytes: int, timeout_s: float | None = None, *, image: str = "host", retry: bool = False,
        long: Callable[[], bool] | None = None, probing: Callable[[], bool] | None = None,
    ) -> str:  # fmt: skip
        """An env (internal id) on ``image`` (the host root by default: a SandboxFusion
        language may name its own image) for the caller alone until ``release``; a ``retry``
        (of a call answered 504) waits in the retry line, served before the others; a
        borrower whose ``long()`` or ``probing()`` is true is held back (``pool_lines``;
        a probing one even while envs are idle). Raises ``Overloaded``
        when none frees within ``acquire_timeout_s`` (or ``timeout_s``, when shorter: the
        caller's deadline); ``EnvFailedError`` if a new one fails."""
        if self.closed:
            raise Overloaded("the service is shutting down", 5.0)
        bucket = self._bucket(tenant, mem_bytes, image)
        wait_s = self.acquire_timeout_s if timeout_s is None else min(self.acquire_timeout_s, max(0.0, timeout_s))
        deadline = time.monotonic() + wait_s
        handed: str | None = None
        while True:
            # another call of its program probes it: it waits for that, even beside idle
            # envs (until it is handed one, or its turn is due)
            held_back = (
                handed is None and not retry and probing is not None
                and time.monotonic() < deadline - HOLD_MARGIN_S and probing()
            )  # fmt: skip
            if not held_back:
                env_id = self._take_idle(bucket)
                if env_id is not None:
                    return env_id
                if self._room(bucket) > 0:
                    fits = self._make_room(bucket, mem_bytes)
                    if fits or bucket.live == 0:  # with none of its own, it cannot wait on itself
                        bucket.live += 1
                        starved = not fits
                        break
            handed = await self._wait_turn(bucket, deadline, retry, long, probing)
            if handed is not None:
                bucket.idle.append(handed)  # taken (and its lease checked) at the top
            elif self.state.closing:
                raise Overloaded("the service is shutting down", 5.0)
        env_id = self.state.scoped(tenant, new_id("pool"))
        self.creating[env_id] = mem_bytes  # counted before its task runs: concurrent borrowers see it
        if starved:
            self.starved.add(env_id)  # until it is placed, envs coming back are released, not kept
        return await self._create_counted(bucket, env_id, tenant, mem_bytes, image)

    async def prewarm(self, tenant: str, mem_bytes: int, count: int, image: str = "host") -> int:
        """Create up to ``count`` envs of (tenant, mem_bytes, image) now, all at once, and
        keep them idle for the first borrowers; returns how many it created. Bounded by
        ``max_envs``, ``max_idle`` and (when envs hold their limits) the nodes' memory, as a
        burst of borrowers is. A creation that fails raises once every creation has ended
        (a server that cannot make a sandbox at start says so, rather than at the first
        call); those made stay in the pool."""
        bucket = self._bucket(tenant, mem_bytes, image)
        made: list[str] = []
        while len(made) < min(count, self.max_idle - len(bucket.idle)) and self._room(bucket) > 0:
            if not self._make_room(bucket, mem_bytes):
                break
            env_id = self.state.scoped(tenant, new_id("pool"))
            bucket.live += 1
            self.creating[env_id] = mem_bytes  # counted before its task runs, as ``acquire`` does
            made.append(env_id)

        async def create(env_id: str) -> None:
            await self._create_counted(bucket, env_id, tenant, mem_bytes, image)
            self._pass_on(bucket, env_id)  # idle, or straight to a borrower already waiting

        outcomes = await asyncio.gather(*(create(env_id) for env_id in made), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
        return len(made)

    def _room(self, bucket: _Bucket) -> int:
        """How many more envs the bucket may create (``max_envs`` in all)."""
        return max(0, self.max_envs - bucket.live)

    def _take_idle(self, bucket: _Bucket) -> str | None:
        """An idle env whose lease is still live (renewed), or None; dead ones are dropped."""
        while bucket.idle:
            env_id = bucket.idle.pop()
            if env_id in self.state.controller.env_specs:  # its lease may have run out
                self.state.controller.renew_env(env_id)
                bucket.used_s = time.monotonic()
                return env_id
            bucket.live -= 1
        return None

    async def _wait_turn(
        self, bucket: _Bucket, deadline: float, retry: bool = False, long: Callable[[], bool] | None = None,
        probing: Callable[[], bool] | None = None,
    ) -> str | None:  # fmt: skip
        """Wait, in line (``pool_lines``), for an env handed over (returned) or a wakeup
        (None: room may have freed, or the service is stopping); ``Overloaded`` at
        ``deadline`` (monotonic).

        No lock: the pool runs on one event loop, and a returned env is handed straight to
        the next turn's future, so hundreds of waiters are served in one pass of the
        loop. (A condition's lock made each wakeup a handoff of one loop iteration: 433
        borrowers queued on it beside 96 idle envs while the loop, short of the interpreter
        lock, ran a few iterations a second, issue 26.) What a borrower that timed out or was
        cancelled had been handed passes to the next."""
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        # a retry is never held back, but one known long goes after the other retries
        turn = Turn(future, long, None if retry else probing, due=deadline - HOLD_MARGIN_S)
        bucket.lines.add(turn, retry)
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                return await future
        except BaseException as exc:
            if not bucket.lines.remove(turn) and future.done() and not future.cancelled():
                self._pass_on(bucket, future.result())
            if isinstance(exc, TimeoutError):
                raise Overloaded(f"all {bucket.live} code sandboxes of this tenant and size stayed busy", 1.0) from None
            raise

    def _pass_on(self, bucket: _Bucket, env_id: str | None) -> None:
        """Hand ``env_id`` to the next turn (``Lines.next_turn``), idle when none may be
        served; None wakes one."""
        turn = bucket.lines.next_turn()
        if turn is not None:
            turn.future.set_result(env_id)
            return
        if env_id is not None:
            bucket.idle.append(env_id)
            bucket.used_s = time.monotonic()

    def recheck_probing(self) -> None:
        """A probe ended (``compat.long_programs``): borrowers that waited for it go back to
        the front of their line, and as many as there are idle envs or room look again."""
        for bucket in self.buckets.values():
            moved = bucket.lines.recheck() if bucket.lines.probing else 0
            for _ in range(min(moved, len(bucket.idle))):
                self._pass_on(bucket, bucket.idle.pop())  # its lease is checked by the taker
                moved -= 1
            for _ in range(min(moved, self._room(bucket))):
                self._pass_on(bucket, None)

    def _make_room(self, bucket: _Bucket, mem_bytes: int) -> bool:
        """Whether the nodes hold ``mem_bytes`` more, after evicting other buckets' idle envs.
        Under per-action memory an env holds only its footprint (the core places it by
        that and grants each run its memory), so a limit never needs room here."""
        controller = self.state.controller
        if getattr(controller.scheduler.policy, "memory_per_action", False):
            return True
        capacity = sum(n.mem_bytes for n in controller.loop.state.spec.cpu_nodes)
        held = sum(s.mem_bytes for s in controller.env_specs.values())
        held += sum(m for e, m in self.creating.items() if e not in controller.env_specs)
        free = capacity - held
        others = sorted((b for b in self.buckets.values() if b is not bucket and b.idle), key=lambda b: b.used_s)
        for other in others:
            while free < mem_bytes and other.idle:
                env_id = other.idle.pop(0)
                other.live -= 1
                sandbox = controller.env_specs.get(env_id)
                free += sandbox.mem_bytes if sandbox is not None else 0
                self._drop(env_id)
        return free >= mem_bytes

    async def _create_counted(self, bucket: _Bucket, env_id: str, tenant: str, mem_bytes: int, image: str) -> str:
        """Create ``env_id``, already counted in ``bucket.live`` and ``creating``; it leaves
        ``creating`` (and ``starved``) either way, and a failure counts it out of the bucket."""
        try:
            return await self._create(env_id, tenant, mem_bytes, image)
        except BaseException:
            self._gone(bucket)
            raise
        finally:
            self.creating.pop(env_id, None)
            self.starved.discard(env_id)

    async def _create(self, env_id: str, tenant: str, mem_bytes: int, image: str) -> str:
        spec = EnvSpec(env_id, mem_bytes, tenant, "", image=image, workspace_bytes=max(512 << 20, mem_bytes // 2))
        # Its own task: a caller that goes away does not abandon a half-created env.
        task = self.state.spawn(self.state.controller.create_env(spec))
        wait_s = min(self.state.create_timeout_s, self.acquire_timeout_s)
        done, _ = await asyncio.wait((task,), timeout=wait_s)
        if not done:
            self.state.controller.release_env(env_id)
            raise Overloaded(f"no node could place a code sandbox within {wait_s:g} s", 5.0)
        task.result()
        return env_id

    def _gone(self, bucket: _Bucket) -> None:
        """One env of the bucket fewer: a waiter may create one."""
        bucket.live -= 1
        self._pass_on(bucket, None)

    def release(self, tenant: str, mem_bytes: int, env_id: str, *, reusable: bool = True, image: str = "host") -> None:
        """Give the env back (``image``: the one it was acquired on): reset in the background,
        then idle (or released when the pool is full, closing, or the env is not ``reusable``).
        Never raises."""
        bucket = self._bucket(tenant, mem_bytes, image)
        if not reusable or self.closed or len(bucket.idle) >= self.max_idle:
            self._drop(env_id)
            self._gone(bucket)
            return
        self._spawn(self._reset(tenant, bucket, env_id))

    async def _reset(self, tenant: str, bucket: _Bucket, env_id: str) -> None:
        try:
            ok, why = await self._run_reset(env_id)
            live = env_id in self.state.controller.env_specs
            reusable = ok and live and not self.closed and not self.starved
            if not ok and live:
                log.info("retiring code sandbox %s: its reset failed: %s", env_id, why[:200])
        except Exception:  # a reset that could not even be submitted: never reuse the env
            reusable = False
        if not reusable:
            self._drop(env_id)
            self._gone(bucket)
            return
        self._pass_on(bucket, env_id)

    async def _run_reset(self, env_id: str) -> tuple[bool, str]:
        """Reset the env; (whether it is clean, why not). Its node's CPU manager empties
        ``RESET_DIRS`` from the host side on a worker thread: no action is scheduled (the
        pool holds the env, nothing runs in it; half of a call's actions were resets) and no
        program is launched (a ``find`` in the sandbox was one more launch per call, whose
        six cgroup joins queued on the kernel's cgroup lock behind everyone else's under
        verl's load, issue 26)."""
        cpu = env_cpu(self.state, env_id)
        ok, why = await asyncio.to_thread(cpu.empty_dirs, env_id, RESET_DIRS)
        return bool(ok), str(why)

    def _drop(self, env_id: str) -> None:
        if env_id in self.state.controller.env_specs:
            self.state.controller.release_env(env_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _wake_all(self) -> None:
        for bucket in list(self.buckets.values()):
            while bucket.lines:
                self._pass_on(bucket, None)

    async def aclose(self) -> None:
        """Wait for resets in flight, then release every idle env. Idempotent."""
        self.closed = True
        if self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self.tasks), timeout=RESET_WAIT_S)
        for bucket in self.buckets.values():
            while bucket.idle:
                self._drop(bucket.idle.pop())
