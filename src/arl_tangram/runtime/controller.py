"""Shell: the live controller: the one controller loop on wall time, inside an asyncio task.

Who calls: the SDK's in-process transport (and later the HTTP API), always on the event
loop the controller was started on. ``submit`` stores the payload, posts ``ActionSubmitted``
with the arrival time and returns at once; ``wait`` awaits the action's one terminal result.
A round runs as soon as events are pending (events posted before it runs share the round),
or when the policy's wake-up comes. A failing round is logged and the controller goes on:
no bug in one round takes the service down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.action import ActionSpec, EnvSpec, ServiceSpec
from arl_tangram.core.elasticity import Learned
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import (
    ActionCancelled,
    ActionFinished,
    ActionSubmitted,
    EnvReleased,
    EnvRequested,
    Event,
    NodeJoined,
    ServiceRegistered,
)
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec
from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ActionStore, Payload
from arl_tangram.runtime.dispatcher import LiveExecutor
from arl_tangram.runtime.loop import ControllerLoop, Round

log = logging.getLogger(__name__)


class WallClock:
    def now(self) -> float:
        return time.monotonic()


class EnvFailedError(RuntimeError):
    """An env could not be created (its sandbox failed to start, or it was released first)."""


class Controller:
    """The live controller over node ``agents``. Start with ``start()`` on the event loop
    that will use it; ``aclose()`` ends every unfinished action ``cancelled``."""

    def __init__(
        self,
        scheduler: Scheduler,
        agents: Sequence[NodeAgent],
        *,
        cluster: ClusterSpec | None = None,
        check: bool = False,
        keep_log: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.node_agents = list(agents)
        self.agents = {nid: a for a in agents for nid in (a.cpu_node_id, a.gpu_node_id)}  # core node id -> agent
        self.store = ActionStore()
        self.clock = WallClock()
        self.log: list[Round] = []
        self.loop = ControllerLoop(
            scheduler, ClusterState.initial(cluster or ClusterSpec()), self.clock, check=check,
            log=self.log.append if keep_log else None, on_wake=lambda _t: self._kick(),
        )  # fmt: skip
        self.env_specs: dict[str, SandboxSpec] = {}
        self.learned: dict[str, Learned] = {}
        self.executor: LiveExecutor | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- life ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self.executor = LiveExecutor(self.agents, self.store, self._report, self.env_specs.get)
        self.loop.attach(self.executor)
        for node_agent in self.node_agents:
            self.join(node_agent)
        self.loop.bootstrap()
        self._task = asyncio.get_running_loop().create_task(self._drive(), name="tangram-controller")

    async def aclose(self) -> None:
        """Idempotent. Unfinished actions end ``cancelled``; envs are destroyed by their managers' close."""
        if self._closed:
            return
        self._closed = True
        self._kick()
        if self._task is not None:
            await self._task
        if self.executor is not None:
            await self.executor.aclose()
        for action_id in self.store.unfinished():
            record = self.store.get(action_id)
            kind = record.spec.kind if record else ""
            self.store.complete(action_id, ActionResult(action_id, kind, "cancelled", cause="the controller closed"))

    def join(self, agent: NodeAgent) -> None:
        """Offer an agent's capacity (again, after a manager was added to it): the core
        learns each of its nodes once."""
        for nid in (agent.cpu_node_id, agent.gpu_node_id):
            self.agents[nid] = agent
            if self.executor is not None:
                self.executor.agents[nid] = agent
        spec = self.loop.state.spec
        known = {n.node_id for n in spec.cpu_nodes} | {n.node_id for n in spec.gpu_nodes}
        for node in (agent.cpu_node_spec(), agent.gpu_node_spec()):
            if node is not None and node.node_id not in known:
                self.post(NodeJoined(node))

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the sink -----------------------------------------------------------------------
    def post(self, event: Event) -> str:
        """Queue an event for the next round (event-loop thread only)."""
        stimulus_id = self.loop.post(event)
        self._kick()
        return stimulus_id

    def _report(self, event: Event) -> object:
        """Events from the executor; a finished action also teaches its kind's learned curve."""
        if isinstance(event, ActionFinished) and event.exec_s:
            record = self.store.get(event.action_id)
            if record is not None and isinstance(record.spec.elasticity, Learned) and record.dop:
                record.spec.elasticity.observe(record.dop, event.exec_s)
        return self.post(event)

    def _kick(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _drive(self) -> None:
        assert self._wakeup is not None
        while not self._closed:
            wake_at = self.loop.wake_at
            timeout = None if wake_at is None else max(0.0, wake_at - self.clock.now())
            if not self.loop.due():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
            self._wakeup.clear()
            if self._closed or not self.loop.due():
                continue
            try:
                self.loop.run_round()
            except Exception:
                log.exception("a controller round failed; its events are dropped, the controller goes on")

    # -- what clients ask -----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the controller is closed")

    def learned_model(self, kind: str) -> Learned:
        """The online-learned elasticity curve of an action kind (used when a caller states none)."""
        return self.learned.setdefault(kind, Learned())

    def submit(self, spec: ActionSpec, payload: Payload) -> ActionRecord:
        """Accept an action; its result arrives in ``record.done``. Raises ``SpecError`` for a
        duplicate id (nothing is queued then)."""
        self._check_open()
        record = self.store.add(spec, payload, self.clock.now())
        self.post(ActionSubmitted(spec, submitted_s=record.submitted_s))
        return record

    async def wait(self, action_id: str, timeout_s: float | None = None) -> ActionResult:
        record = self.store.get(action_id)
        if record is None:
            raise SpecError("action_id", "must name a live action", action_id)
        return await asyncio.wait_for(asyncio.shield(record.done), timeout_s)

    def cancel(self, action_id: str) -> None:
        """Withdraw an action: a queued one ends ``cancelled`` in the next round, a running one
        is stopped by its executor. Idempotent; an ended action is left alone."""
        record = self.store.get(action_id)
        if record is not None and record.result is None:
            self.post(ActionCancelled(action_id))

    async def create_env(self, spec: EnvSpec, sandbox: SandboxSpec) -> None:
        """Request an env and wait until its sandbox is ready; ``EnvFailedError`` names why not."""
        self._check_open()
        if spec.env_id in self.loop.state.envs or spec.env_id in self.env_specs:
            raise SpecError("env_id", "must be unique among live envs", spec.env_id)
        assert self.executor is not None
        waiter: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.executor.env_waiters[spec.env_id] = waiter
        self.env_specs[spec.env_id] = sandbox
        self.post(EnvRequested(spec))
        failure = await asyncio.shield(waiter)
        if failure is not None:
            self.env_specs.pop(spec.env_id, None)
            raise EnvFailedError(f"env {spec.env_id}: {failure}")

    def release_env(self, env_id: str) -> None:
        """Give an env back: its queued actions end ``cancelled``, its sandbox is destroyed."""
        self.env_specs.pop(env_id, None)
        self.post(EnvReleased(env_id))

    def env_node(self, env_id: str) -> NodeAgent:
        """The agent of the node an env's sandbox lives on (host-side file and session calls).
        ``create_env`` returned, so the sandbox exists, even if the round that marks it ready
        in the core has not run yet."""
        env = self.loop.state.envs.get(env_id)
        if env is None or env.node_id is None or env_id not in self.env_specs:
            raise SpecError("env_id", "must name a live env", env_id)
        return self.agents[env.node_id]

    def register_service(self, spec: ServiceSpec) -> None:
        self.post(ServiceRegistered(spec))
