"""Shell: the live controller: the one controller loop on wall time, inside an asyncio task.

Who calls: the SDK's in-process transport and the HTTP API, always on the event loop the
controller was started on. ``submit`` passes admission (tenant limits, the service's bound),
stores the payload, journals it, posts ``ActionSubmitted`` with the arrival time and returns
at once; ``wait`` awaits the action's one terminal result. A round runs as soon as events are
pending (events posted before it runs share the round), or when the policy's wake-up comes.
A failing round is logged and the controller goes on: no bug in one round takes the service
down. Beside the loop, one housekeeping task (``housekeeping``) expires env leases and
retained results; ``recovery`` gives the actions of a dead process their outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.action import ActionSpec, EnvSpec, ServiceSpec
from arl_tangram.core.elasticity import Learned
from arl_tangram.core.env_spec import check_image_reference
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import (
    ActionCancelled,
    ActionFinished,
    ActionSubmitted,
    EnvReleased,
    EnvRequested,
    Event,
    NodeJoined,
    PrefetchRequested,
    ServiceRegistered,
)
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import ClusterSpec
from arl_tangram.runtime import recovery, shutdown
from arl_tangram.runtime.actions import (
    ActionRecord,
    ActionResult,
    ActionStore,
    Payload,
    read_result,
)
from arl_tangram.runtime.codec import payload_to_dict, result_to_dict, spec_to_dict
from arl_tangram.runtime.config import ConfigError, ServiceSettings, TenantConfig
from arl_tangram.runtime.config_images import image_alias
from arl_tangram.runtime.dispatcher import LiveExecutor
from arl_tangram.runtime.housekeeping import Housekeeper
from arl_tangram.runtime.images import layers_of_node, resolve_env_image
from arl_tangram.runtime.journal import Journal, JournalRow
from arl_tangram.runtime.leases import EnvLeases, ExpiredEnv
from arl_tangram.runtime.loop import Clock, ControllerLoop, Round
from arl_tangram.runtime.snapshots import SnapshotService
from arl_tangram.runtime.tenants import Admission

log = logging.getLogger(__name__)


class WallClock:
    def now(self) -> float:
        return time.monotonic()


class EnvFailedError(RuntimeError):
    """An env could not be created (its sandbox failed to start, or it was released first)."""


class Controller:
    """The live controller over node ``agents``. Start with ``start()`` on the event loop
    that will use it (then ``resume()`` once services are registered, when it keeps a
    journal); ``aclose()`` ends every unfinished action ``cancelled``. ``settings`` and
    ``tenants`` (``[service]``, ``[tenants.*]``) default to the embedded ones: no journal,
    no tenant limits. ``clock`` (wall time by default) times leases and retention too."""

    def __init__(
        self,
        scheduler: Scheduler,
        agents: Sequence[NodeAgent],
        *,
        cluster: ClusterSpec | None = None,
        check: bool = False,
        keep_log: bool = False,
        settings: ServiceSettings | None = None,
        tenants: Mapping[str, TenantConfig] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.node_agents = list(agents)
        self.agents = {nid: a for a in agents for nid in (a.cpu_node_id, a.gpu_node_id)}  # core node id -> agent
        self.settings = settings or ServiceSettings()
        self.clock: Clock = clock or WallClock()
        self.store = ActionStore(self.clock.now)
        self.store.on_complete = self._on_complete
        self.leases = EnvLeases(self.settings.env_idle_ttl_s)
        self.admission = Admission(tenants or {}, self.settings.max_queued_actions)
        self.journal: Journal | None = None
        self.housekeeper = Housekeeper(self)
        #: called with each env the service released because its lease ran out
        self.on_env_expired: list[Callable[[ExpiredEnv], None]] = []
        #: ``[images] aliases``: a reference a client names -> the one its env runs (``image_alias``)
        self.image_aliases: Mapping[str, str] = {}
        self._unresumed: list[ActionRecord] = []
        self.log: list[Round] = []
        self.loop = ControllerLoop(
            scheduler, ClusterState.initial(cluster or ClusterSpec()), self.clock, check=check,
            log=self.log.append if keep_log else None, on_wake=lambda _t: self._kick(),
        )  # fmt: skip
        self.env_specs: dict[str, EnvSpec] = {}  # live envs (created or being created)
        self.snapshots = SnapshotService(self)  # snapshot, fork, rollback (runtime.snapshots)
        self.learned: dict[str, Learned] = {}
        self.executor: LiveExecutor | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._stopping: str | None = None  # why new work is refused (``begin_shutdown``)

    # -- life ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the loop and housekeeping; with a journal, open it and make the results it
        retains readable again (``resume`` deals with the actions it left unfinished)."""
        self._wakeup = asyncio.Event()
        rows: list[JournalRow] = []
        if self.settings.journal_path is not None:
            try:
                self.journal = await asyncio.to_thread(Journal, self.settings.journal_path)
                rows = await asyncio.to_thread(self.journal.load, self.housekeeper.prune_cuts())
            except (OSError, sqlite3.Error) as exc:
                if self.journal is not None:
                    await asyncio.to_thread(self.journal.close)
                    self.journal = None
                raise ConfigError("service.journal_path", f"must be a writable SQLite journal ({exc})", self.settings.journal_path) from exc
        before_run = self._journal_start if self.journal is not None else None
        self.executor = LiveExecutor(self.agents, self.store, self._report, self.env_specs.get, before_run=before_run)
        self.loop.attach(self.executor)
        for node_agent in self.node_agents:
            self.join(node_agent)
        self.loop.bootstrap()
        self._unresumed = recovery.restore_results(self, rows)
        self._task = asyncio.get_running_loop().create_task(self._drive(), name="tangram-controller")
        self.housekeeper.start()

    def resume(self) -> recovery.Resumed:
        """Give every action the journal left unfinished its outcome: re-run one that never
        started, end the others ``error`` (``service_restarted``). Call once the services
        are registered (a re-run service call needs its service); idempotent."""
        rows, self._unresumed = self._unresumed, []
        return recovery.resume(self, rows)

    def begin_shutdown(self, cause: str = shutdown.SHUTTING_DOWN) -> None:
        """The service is stopping: pending env creations end (``EnvFailedError`` naming
        ``cause``), queued actions end ``error`` (``cause``, journaled), running ones are
        stopped, new submissions and env requests are refused. Idempotent; ``aclose``
        follows (``runtime.shutdown`` says why this comes first)."""
        if self._stopping is not None or self._closed:
            return
        self._stopping = cause
        creations, queued, running = shutdown.end_pending(self, cause)
        log.info("stopping (%s): %d env creations and %d queued actions ended, %d running stopped", cause, creations, queued, running)

    async def aclose(self) -> None:
        """Idempotent. Unfinished actions end ``cancelled``; envs are destroyed by their
        managers' close. With a journal, actions that never started are left unfinished in
        it, so a restarted service runs them."""
        if self._closed:
            return
        self._closed = True
        self._kick()
        await self.housekeeper.aclose()
        if self._task is not None:
            await self._task
        if self.executor is not None:
            await self.executor.aclose()
        for action_id in self.store.unfinished():
            record = self.store.get(action_id)
            kind = record.spec.kind if record else ""
            self.store.complete(action_id, ActionResult(action_id, kind, "cancelled", cause="the controller closed"))
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)

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
                layers = layers_of_node(agent) if node.node_id == agent.cpu_node_id else None
                if layers is not None:
                    self.post(layers)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the sink -----------------------------------------------------------------------
    def post(self, event: Event) -> str:
        """Queue an event for the next round (event-loop thread only)."""
        stimulus_id = self.loop.post(event)
        if self.executor is not None:
            self.executor.note_posted(event)
        self._kick()
        return stimulus_id

    def _report(self, event: Event) -> object:
        """Events from the executor; a finished action also teaches its kind's learned curve."""
        if isinstance(event, ActionFinished) and event.exec_s:
            record = self.store.get(event.action_id)
            if record is not None and isinstance(record.spec.elasticity, Learned) and record.dop:
                record.spec.elasticity.observe(record.dop, event.exec_s)
        return self.post(event)

    def _on_complete(self, record: ActionRecord) -> None:
        """Every result, once: the end renews its env's lease and is journaled (but not
        the ``cancelled`` that closing gives an action that never started: it re-runs)."""
        self.housekeeper.note_completion()
        if record.spec.binding.kind == "env":
            self.leases.renew(record.spec.binding.name, self.clock.now())
        if self.journal is not None and record.result is not None and not (self._closed and record.started_s is None):
            self.journal.ended(record.spec.action_id, result_to_dict(record.result), time.time())

    async def _journal_start(self, record: ActionRecord) -> None:
        assert self.journal is not None
        await asyncio.wrap_future(self.journal.started(record.spec.action_id, time.time()))

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
        if self._stopping is not None:
            raise RuntimeError(f"the controller is stopping ({self._stopping})")

    def learned_model(self, kind: str) -> Learned:
        """The online-learned elasticity curve of an action kind (used when a caller states none)."""
        return self.learned.setdefault(kind, Learned())

    def submit(self, spec: ActionSpec, payload: Payload, *, request_id: str | None = None) -> ActionRecord:
        """Accept an action; its result arrives in ``record.done``.

        Idempotent under ``request_id``: the same (``spec.tenant``, ``request_id``) returns
        the record already accepted (after its retention, the journaled one, its ``done``
        resolved) and queues nothing, whatever the new spec says. Raises, with nothing
        queued: ``SpecError`` for a duplicate action id or a payload the journal cannot
        hold, ``TenantLimitError``, ``OverloadedError``."""
        self._check_open()
        if request_id is not None:
            existing = self.store.by_request(spec.tenant, request_id) or recovery.journaled(self, spec.tenant, request_id)
            if existing is not None:
                return existing
        if self.store.get(spec.action_id) is not None:
            raise SpecError("action_id", "must be unique among live actions", spec.action_id)
        self._check_memory(spec)
        self.admission.check_action(spec.tenant, self.store)
        if self.journal is not None:
            self.journal.accepted(
                spec.action_id, spec.tenant, request_id, spec_to_dict(spec), payload_to_dict(payload), time.time()
            )  # fmt: skip
        record = self.store.add(spec, payload, self.clock.now(), request_id)
        if spec.binding.kind == "env":
            self.leases.renew(spec.binding.name, record.submitted_s)
        self.post(ActionSubmitted(spec, submitted_s=record.submitted_s))
        return record

    def _check_memory(self, spec: ActionSpec) -> None:
        """A declared memory demand above its env's limit can never run: ``SpecError``."""
        if spec.memory_bytes is None or spec.binding.kind != "env":
            return
        env = self.loop.state.envs.get(spec.binding.name)
        if env is not None and spec.memory_bytes > env.spec.mem_bytes:
            raise SpecError("memory", f"must be <= the env's memory limit ({env.spec.mem_bytes} bytes)", spec.memory_bytes)

    def get(self, action_id: str) -> ActionRecord | None:
        """The record of a live or retained action; None once acknowledged or expired."""
        return self.store.get(action_id)

    def ack(self, action_id: str) -> bool:
        """The caller has the result: forget it now (not reloaded after a restart; its
        request id stays idempotent through the journal). An unfinished action is left
        alone (False). Idempotent."""
        if not self.store.forget(action_id):
            return False
        if self.journal is not None:
            self.journal.acked(action_id)
        return True

    async def flush_journal(self) -> None:
        """Wait until every accepted action, start and result so far is committed to the
        journal (an HTTP handler may await it before answering). No journal: returns."""
        if self.journal is not None:
            await asyncio.wrap_future(self.journal.flush())

    async def wait(self, action_id: str, timeout_s: float | None = None) -> ActionResult:
        record = self.store.get(action_id)
        if record is None:
            raise SpecError("action_id", "must name a live action", action_id)
        return await asyncio.wait_for(read_result(record), timeout_s)  # held outputs fetched for the caller

    def cancel(self, action_id: str) -> None:
        """Withdraw an action: a queued one ends ``cancelled`` in the next round, a running one
        is stopped by its executor. Idempotent; an ended action is left alone."""
        record = self.store.get(action_id)
        if record is not None and record.result is None:
            self.post(ActionCancelled(action_id))

    async def create_env(self, spec: EnvSpec) -> None:
        """Request an env and wait until its sandbox is ready; ``EnvFailedError`` names why not.
        An image env carries its image's layers when a node's store knows them (placement
        prefers nodes holding them); ``SpecError`` on ``image`` if no node can run images."""
        if self._stopping is not None and not self._closed:
            raise EnvFailedError(f"env {spec.env_id}: {self._stopping}")
        self._check_open()
        if spec.snapshot and not spec.fork_of:  # on the snapshot's node, where its layers are
            spec = self.snapshots.spec_from(spec.snapshot, spec.tenant, spec)
        if spec.image in self.image_aliases:  # every face and the SDK come through here
            spec = replace(spec, image=image_alias(self.image_aliases, spec.image))
        spec = await resolve_env_image(self.node_agents, spec)
        if spec.env_id in self.loop.state.envs or spec.env_id in self.env_specs:
            raise SpecError("env_id", "must be unique among live envs", spec.env_id)
        self.admission.check_env(spec.tenant, spec.mem_bytes, self.leases)
        assert self.executor is not None
        waiter: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.executor.env_waiters[spec.env_id] = waiter
        self.env_specs[spec.env_id] = spec
        self.leases.add(spec.env_id, spec.tenant, spec.mem_bytes, self.clock.now())
        self.post(EnvRequested(spec))
        failure = await asyncio.shield(waiter)
        if failure is not None:
            self.env_specs.pop(spec.env_id, None)
            self.leases.drop(spec.env_id)
            raise EnvFailedError(f"env {spec.env_id}: {failure}")

    def prefetch(self, image: str, node_ids: Sequence[str] = ()) -> None:
        """Pull ``image`` onto ``node_ids`` (the core's CPU node ids; every node when empty)
        ahead of the envs that will need it: one pull per node lacking its layers."""
        self._check_open()
        image = image_alias(self.image_aliases, check_image_reference(image))
        self.post(PrefetchRequested(check_image_reference(image), tuple(node_ids)))

    def release_env(self, env_id: str) -> None:
        """Give an env back: its queued actions end ``cancelled``, its sandbox is destroyed."""
        self.env_specs.pop(env_id, None)
        self.leases.drop(env_id)
        self.post(EnvReleased(env_id))

    def renew_env(self, env_id: str) -> None:
        """Keep an env alive for another ``env_idle_ttl_s``; ``SpecError`` if it is not live."""
        if not self.leases.renew(env_id, self.clock.now()):
            raise SpecError("env_id", "must name a live env", env_id)

    def expired_env(self, env_id: str) -> ExpiredEnv | None:
        """Why an env is gone, if its lease ran out (the last ``MAX_EXPIRED_KEPT`` expiries)."""
        return self.leases.expired.get(env_id)

    @property
    def expired_envs(self) -> list[ExpiredEnv]:
        """Envs released by lease expiry, oldest first."""
        return list(self.leases.expired.values())

    def env_node(self, env_id: str) -> NodeAgent:
        """The agent of the node an env's sandbox lives on (host-side file and session calls).
        ``create_env`` returned, so the sandbox exists, even if the round that marks it ready
        in the core has not run yet."""
        env = self.loop.state.envs.get(env_id)
        if env is None or env.node_id is None or env_id not in self.env_specs:
            raise SpecError("env_id", "must name a live env", env_id)
        self.leases.renew(env_id, self.clock.now())  # a file or session call is a use
        return self.agents[env.node_id]

    def register_service(self, spec: ServiceSpec) -> None:
        self.post(ServiceRegistered(spec))
