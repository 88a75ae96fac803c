"""Shell: the dispatcher, the live executor that carries the controller's decisions out on node agents.

Runs on the controller's asyncio thread. Every handler returns at once: blocking manager
calls (a fork, a copy, a model call) go to a bounded pool of worker threads, API calls are
coroutines, and each piece of work is a tracked task, so ``aclose`` can end them all. What
happens is reported back through the loop's sink with the decision's stimulus id:
``EnvReady`` / ``EnvFailed``, ``ServiceReady`` / ``ReplicaFailed``, ``ActionFinished``
(with the attempt it answers). Each action's terminal result goes to the ``ActionStore``
(first wins), and only from its current attempt: after a ``RetryAction`` the lost attempt's
run is stopped and whatever it still reports is dropped here (and ignored by the core).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from arl_tangram.agent.envs import create_env_sandbox, destroy_env_sandbox
from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.decisions import (
    CancelAction,
    EvictService,
    GrowMemory,
    LoadService,
    OomKill,
    PlaceEnv,
    PreemptAction,
    PullImage,
    RejectAction,
    ReleaseEnv,
    RetryAction,
    StartAction,
)
from arl_tangram.core.env_spec import EnvSpec
from arl_tangram.core.events import (
    ActionFinished,
    ActionMemoryPaused,
    EnvFailed,
    EnvFootprint,
    EnvReady,
    Event,
    NodeJoined,
    NodeLost,
    ReplicaFailed,
    ServiceReady,
)
from arl_tangram.managers.cpu.cancel_flag import CancelFlag
from arl_tangram.managers.cpu.preempt import RunHandle
from arl_tangram.runtime.actions import (
    ActionRecord,
    ActionResult,
    ActionStore,
    ApiPayload,
    ExecPayload,
    NoopPayload,
    ServicePayload,
    SnapshotPayload,
)
from arl_tangram.runtime.images import run_pull
from arl_tangram.runtime.loop import Executor
from arl_tangram.runtime.runs import run_api, run_exec, run_service
from arl_tangram.runtime.snapshots import run_snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_WORKER_THREADS = 512  # blocking manager calls in flight at once (most wait on a child)


class LiveExecutor(Executor):
    """Decisions -> manager calls. ``agents`` maps the core's node ids to their agent;
    ``post`` is the loop's sink; ``env_specs`` gives the spec of a live env id;
    ``before_run`` (the journal's durable start) is awaited before an action's work begins."""

    def __init__(
        self,
        agents: Mapping[str, NodeAgent],
        store: ActionStore,
        post: Callable[[Event], object],
        env_specs: Callable[[str], EnvSpec | None],
        *,
        worker_threads: int = DEFAULT_WORKER_THREADS,
        before_run: Callable[[ActionRecord], Awaitable[None]] | None = None,
        memory_pause: bool = True,
    ) -> None:
        self.agents = dict(agents)
        # pause-and-grow (issue 21): an action over its memory grant waits for the core's
        # decision; off, the kernel OOM-kills it at its grant
        self.memory_pause = memory_pause
        self.store = store
        self.post = post
        self.env_specs = env_specs
        self.before_run = before_run
        self.pool = concurrent.futures.ThreadPoolExecutor(worker_threads, thread_name_prefix="tangram-worker")
        # Demotions must not wait behind the runs that fill the worker pool: a thread of their own.
        self.control_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tangram-control")
        self.tasks: set[asyncio.Task[Any]] = set()
        self.env_waiters: dict[str, asyncio.Future[str | None]] = {}  # env id -> None or why it failed
        self.replica_ready: dict[str, asyncio.Future[str | None]] = {}  # replica id -> None or why it failed
        self.replica_nodes: dict[str, str] = {}  # replica id -> the node it was loaded on
        self.cancels: dict[str, threading.Event] = {}  # running action -> its cancel flag
        self.handles: dict[str, RunHandle] = {}  # running exec action -> its demotion handle
        self.running_tasks: dict[str, asyncio.Task[Any]] = {}
        self.lost_nodes: set[str] = set()  # a NodeLost was posted for them, no NodeJoined since
        self.closed = False

    # -- plumbing -----------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("executor task %s failed", task.get_name(), exc_info=task.exception())

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking manager call on a worker thread; the event loop never waits on it."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def _agent(self, node_id: str) -> NodeAgent:
        return self.agents[node_id]

    def note_posted(self, event: Event) -> None:
        """Every event posted to the loop (the controller's sink calls this): which nodes
        are lost, before the core's round about it has run."""
        if isinstance(event, NodeLost):
            self.lost_nodes.add(event.node_id)
        elif isinstance(event, NodeJoined):
            self.lost_nodes.discard(event.node.node_id)

    # -- envs ---------------------------------------------------------------------------
    def place_env(self, d: PlaceEnv) -> None:
        self._spawn(self._create_env(d), f"place-env:{d.env_id}")

    async def _create_env(self, d: PlaceEnv) -> None:
        agent = self._agent(d.node_id)
        cpu = agent.cpu
        try:
            spec = self.env_specs(d.env_id)
            if spec is None or cpu is None:
                raise RuntimeError(f"env {d.env_id} was released" if spec is None else f"node {d.node_id} has no CPU manager")
            await self.blocking(create_env_sandbox, agent, spec, d.env_id)
            if d.held.cpu_millicores:
                # A pod-style holding is a real cgroup limit for the env's life.
                await self.blocking(cpu.hold, d.env_id, d.held.cpu_millicores, d.numa_millicores or None)
        except Exception as exc:  # any failure to start is the env's, reported, never raised
            why = f"{type(exc).__name__}: {exc}"
            self.post(EnvFailed(d.env_id, why, stimulus_id=d.stimulus_id))
            self._resolve_env(d.env_id, why)
            return
        self.post(EnvReady(d.env_id, stimulus_id=d.stimulus_id))
        self._resolve_env(d.env_id, None)

    def _resolve_env(self, env_id: str, failure: str | None) -> None:
        waiter = self.env_waiters.pop(env_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(failure)

    def release_env(self, d: ReleaseEnv) -> None:
        self._resolve_env(d.env_id, d.reason)
        if d.node_id is not None:
            self._spawn(self._destroy_env(d), f"release-env:{d.env_id}")

    async def _destroy_env(self, d: ReleaseEnv) -> None:
        try:
            # never created, or already gone with a failure: left alone
            await self.blocking(destroy_env_sandbox, self._agent(d.node_id or ""), d.env_id)
        except Exception:  # a lost node, a manager closing: logged, the release stands
            log.exception("destroying env %s failed", d.env_id)

    def pull_image(self, d: PullImage) -> None:
        self._spawn(run_pull(self.blocking, self._agent(d.node_id), d, self.post), f"pull:{d.pull_id}")

    # -- replicas -----------------------------------------------------------------------
    def load_service(self, d: LoadService) -> None:
        self.replica_ready[d.replica_id] = asyncio.get_running_loop().create_future()
        self.replica_nodes[d.replica_id] = d.node_id
        self._spawn(self._load(d), f"load:{d.replica_id}")

    async def _load(self, d: LoadService) -> None:
        gpu = self._agent(d.node_id).gpu
        failure: str | None = None
        try:
            if gpu is None:
                raise RuntimeError(f"node {d.node_id} has no GPU manager")
            await self.blocking(gpu.load, d.replica_id, d.service, list(range(d.offset, d.offset + d.size)))
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        event: Event = ServiceReady(d.replica_id, stimulus_id=d.stimulus_id)
        if failure is not None:
            event = ReplicaFailed(d.replica_id, failure, stimulus_id=d.stimulus_id)
        self.post(event)
        ready = self.replica_ready.get(d.replica_id)
        if ready is not None and not ready.done():
            ready.set_result(failure)

    def evict_service(self, d: EvictService) -> None:
        self.replica_ready.pop(d.replica_id, None)
        node_id = self.replica_nodes.pop(d.replica_id, "")
        self._spawn(self._evict(node_id, d.replica_id), f"evict:{d.replica_id}")

    async def _evict(self, node_id: str, replica_id: str) -> None:
        agent = self.agents.get(node_id)
        if agent is None or agent.gpu is None:
            return
        try:
            await self.blocking(agent.gpu.evict, replica_id)
        except Exception:
            log.exception("evicting replica %s failed", replica_id)

    # -- actions ------------------------------------------------------------------------
    def start_action(self, d: StartAction) -> None:
        record = self.store.get(d.action_id)
        if record is None:  # submitted by someone else (a test driving the core directly)
            self.post(ActionFinished(d.action_id, "error", None, stimulus_id=d.stimulus_id))
            return
        if record.result is not None:  # a late result that raced its node's loss ended it
            self.post(ActionFinished(d.action_id, record.result.outcome, None, stimulus_id=d.stimulus_id, attempt=d.attempt))
            return
        record.started_s = time.monotonic()
        record.node_id, record.dop, record.attempt = d.node_id, d.dop, d.attempt
        if isinstance(record.payload, NoopPayload):
            self._finish(record, d, ActionResult(d.action_id, record.spec.kind, "succeeded"), 0.0)
            return
        self.cancels[d.action_id] = CancelFlag()  # wakes its pump when set (no polling)
        if isinstance(record.payload, ExecPayload):
            on_demoted = functools.partial(_note_demoted, asyncio.get_running_loop(), record)
            self.handles[d.action_id] = RunHandle(on_demoted=on_demoted)
        self.running_tasks[d.action_id] = self._spawn(self._run(record, d), f"action:{d.action_id}")

    async def _run(self, record: ActionRecord, d: StartAction) -> None:
        payload = record.payload
        cancel = self.cancels[d.action_id]
        task = self.running_tasks[d.action_id]
        handle = self.handles.get(d.action_id)
        try:
            if self.before_run is not None:
                await self.before_run(record)
            if isinstance(payload, ExecPayload):
                result, exec_s = await run_exec(self, self._agent(d.node_id), record, d, payload, cancel, handle)
            elif isinstance(payload, ServicePayload):
                result, exec_s = await run_service(self, self._agent(d.node_id), record, d, payload, cancel)
            elif isinstance(payload, ApiPayload):
                result, exec_s = await run_api(self._api_agent(), record, payload)
            elif isinstance(payload, SnapshotPayload):
                result, exec_s = await run_snapshot(self, self._agent(d.node_id), record, d, payload)
            else:
                raise TypeError(f"no runner for {type(payload).__name__}")
        except asyncio.CancelledError:
            result, exec_s = ActionResult(d.action_id, record.spec.kind, "cancelled", cause="cancelled"), 0.0
        except Exception as exc:  # a manager's failure is this action's error, never the loop's
            log.debug("action %s failed in its manager", d.action_id, exc_info=True)
            result, exec_s = ActionResult(d.action_id, record.spec.kind, "error", cause=f"{type(exc).__name__}: {exc}"), 0.0
        finally:
            # Only this attempt's entries: a retry's own may already be there.
            if self.cancels.get(d.action_id) is cancel:
                del self.cancels[d.action_id]
            if self.running_tasks.get(d.action_id) is task:
                del self.running_tasks[d.action_id]
            if handle is not None and self.handles.get(d.action_id) is handle:
                del self.handles[d.action_id]
        self._finish(record, d, result, exec_s)

    def _api_agent(self) -> NodeAgent:
        for agent in self.agents.values():
            if agent.api is not None:
                return agent
        raise RuntimeError("no node has an API manager")

    def _finish(self, record: ActionRecord, d: StartAction, result: ActionResult, exec_s: float) -> None:
        timed = _timed(record, result, exec_s)
        # A lost attempt's result is not the action's. Nor is the failure of an attempt whose
        # node was just declared lost, if the action may be retried: the core's answer to
        # the loss (already posted) queues it again or ends it, and that decides.
        lost = record.spec.retryable and d.node_id in self.lost_nodes and not result.ok
        if record.attempt == d.attempt and not lost:
            self.store.complete(d.action_id, timed)
        self.post(ActionFinished(
            d.action_id, result.outcome, timed.exec_s or None, stimulus_id=d.stimulus_id, attempt=d.attempt,
            peak_mem_bytes=result.peak_mem_bytes or None, paused_s=result.paused_s, cpu_s=result.cpu_s or None,
        ))  # fmt: skip
        if record.footprint_bytes is not None and record.spec.binding.kind == "env":
            # after the finish, in the same round: the grant is gone, the footprint is charged
            self.post(EnvFootprint(record.spec.binding.name, record.footprint_bytes, stimulus_id=d.stimulus_id))
            record.footprint_bytes = None

    # -- memory per action ---------------------------------------------------------------
    def memory_paused_reporter(self, d: StartAction) -> Callable[[int], None]:
        """The manager's pause callback for ``d`` (called on its watch thread): posts
        ``ActionMemoryPaused`` on the loop."""
        loop = asyncio.get_running_loop()

        def report(usage_bytes: int) -> None:
            event = ActionMemoryPaused(d.action_id, usage_bytes, stimulus_id=d.stimulus_id)
            loop.call_soon_threadsafe(self.post, event)

        return report

    def grow_memory(self, d: GrowMemory) -> None:
        cpu = self._agent(d.node_id).cpu
        if cpu is not None:
            self._spawn(self.blocking(cpu.grow_memory, d.env_id, d.limit_bytes), f"grow-memory:{d.action_id}")

    def oom_kill(self, d: OomKill) -> None:
        """The kernel ends the paused action (its result says ``oom_killed``); if it is no
        longer paused with a watch (it just ended), there is nothing to do."""
        cpu = self._agent(d.node_id).cpu
        if cpu is not None:
            self._spawn(self.blocking(cpu.oom_kill, d.env_id), f"oom-kill:{d.action_id}")

    def reject_action(self, d: RejectAction) -> None:
        self._stop(d.action_id)  # a running one: the core ended it (its env, replica or node is gone)
        record = self.store.get(d.action_id)
        if record is not None:
            ended = ActionResult(d.action_id, record.spec.kind, d.outcome, cause=d.reason)
            self.store.complete(d.action_id, _timed(record, ended, 0.0))

    def cancel_action(self, d: CancelAction) -> None:
        self._stop(d.action_id)

    def preempt_action(self, d: PreemptAction) -> None:
        """Demote a running exec (its cores were re-granted by the core): a worker thread
        lowers its slot's CPU weight; it runs on and ends as it would have."""
        handle = self.handles.get(d.action_id)
        if handle is not None:
            demote = asyncio.get_running_loop().run_in_executor(self.control_pool, handle.demote, d.known_long)
            self._spawn(_awaited(demote), f"preempt:{d.action_id}")

    def retry_action(self, d: RetryAction) -> None:
        """The attempt's node is lost and the core queued the action again: stop what is
        left of the attempt (its proxy call ends with the node anyway) and forget it, so
        the next ``StartAction`` runs afresh and this attempt's result is dropped."""
        record = self.store.get(d.action_id)
        if record is None or record.result is not None:
            return
        self._stop(d.action_id)
        self.cancels.pop(d.action_id, None)
        self.running_tasks.pop(d.action_id, None)
        record.attempt = d.attempt + 1
        record.started_s, record.node_id = None, None  # queued again (``queued`` to readers)

    def _stop(self, action_id: str) -> None:
        """Stop a running action: an exec's cancel flag kills its processes (it then ends
        ``cancelled``); other work is cancelled as a task."""
        flag = self.cancels.get(action_id)
        if flag is not None:
            flag.set()
        record = self.store.get(action_id)
        task = self.running_tasks.get(action_id)
        if task is not None and record is not None and not isinstance(record.payload, ExecPayload):
            task.cancel()

    # -- shutdown -----------------------------------------------------------------------
    async def aclose(self) -> None:
        """Stop everything in flight; each unfinished action ends ``cancelled``."""
        self.closed = True
        for action_id in list(self.running_tasks):
            self._stop(action_id)
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        for waiter in [*self.env_waiters.values(), *self.replica_ready.values()]:
            if not waiter.done():
                waiter.set_result("the controller closed")
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.control_pool.shutdown(wait=True, cancel_futures=True)



def _note_demoted(loop: asyncio.AbstractEventLoop, record: ActionRecord, at_s: float) -> None:
    """The run was demoted at ``at_s``: its handle's callback, on whichever thread demoted
    it; the record learns it on the event loop (``ActionRecord.note_demoted``)."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to tell
        loop.call_soon_threadsafe(record.note_demoted, at_s)


async def _awaited(fut: asyncio.Future[Any]) -> Any:
    return await fut


def _timed(record: ActionRecord, result: ActionResult, exec_s: float) -> ActionResult:
    """``result`` with the action's completion time split as of now: queue from arrival to
    start (to now if it never started), the measured execution, the rest as overhead."""
    now = time.monotonic()
    started = record.started_s if record.started_s is not None else now
    # paused time (memory pauses, preemption) is queue time, never execution (contract A)
    paused_s = min(max(0.0, result.paused_s), max(0.0, exec_s))
    queue_s = max(0.0, started - record.submitted_s) + paused_s
    act_s = max(0.0, now - record.submitted_s)
    exec_s = min(max(0.0, exec_s - paused_s), max(0.0, act_s - queue_s))
    return replace(
        result, queue_s=queue_s, exec_s=exec_s, overhead_s=max(0.0, act_s - queue_s - exec_s),
        dop=record.dop, node_id=record.node_id, attempts=max(1, record.attempt),
    )  # fmt: skip
