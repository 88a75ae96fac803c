"""Shell: which Ray nodes are ARL-Tangram nodes, now: agents started on nodes that join,
nodes declared lost when their agent's heartbeat stops.

Runs on the controller's event loop, as one tracked task (``run``) with two loops:
  * join: every ``join_poll_s``, ``ray.nodes()`` (on a thread: it is a GCS call) lists the
    alive nodes offering ``resource`` (sandboxes) or ``gpu_resource`` (models); each new
    one gets an agent actor pinned there (hard node affinity), which reports its capacity;
    the services registered so far are registered on a GPU node, then ``controller.join``
    makes its capacity schedulable, without a restart.
  * heartbeat: every ``heartbeat_s`` each agent is pinged (at most one ping in flight per
    agent; ping runs apart from the actor's action threads). An agent whose last answer is
    older than ``loss_after_s``, whose actor died, or whose Ray node Ray reports dead, is
    lost: its calls in flight end (an action as an ``error`` outcome naming ``node_lost``,
    other calls with ``NodeLostError``) and ``NodeLost`` is posted for its CPU and GPU ids, so the core ends its running actions ``error`` (``node_lost``),
    its envs lost and its replicas gone, and places nothing there again.
  * comeback: a node lost for silence alone may have been paused (a long GC pause, a
    network blip), not dead: it is still pinged for ``rejoin_within_s``. If it answers, its
    agent is told to drop everything it held (``reset``: its envs' owners were told they
    are lost, its actions have ended) and the node joins again (``NodeJoined``) with fresh
    capacity, without a restart. A node whose actor died, whose Ray node Ray reports dead,
    or that stays silent past ``rejoin_within_s`` is given up: its actor is killed (its CPU
    manager's keeper then removes its sandboxes, should the node still be up).
A Ray node given up never rejoins (Ray gives a restarted node a new id, which joins afresh).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.agent.node import NodeAgent
from arl_tangram.backends.ray.actor import GpuSettings, NodeReport, actor_class
from arl_tangram.backends.ray.held import DEFAULT_HOLD_MIN_BYTES
from arl_tangram.backends.ray.proxies import NodeLink, RayCpuProxy, RayGpuProxy
from arl_tangram.core.events import NodeLost
from arl_tangram.managers.cpu.config import CpuManagerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RaySettings:
    """The Ray backend's knobs. ``resource`` marks sandbox nodes, ``gpu_resource`` model
    nodes (a node may offer both); ``loss_after_s`` without a heartbeat answer declares a
    node lost (keep it above a few ``heartbeat_s``); a node lost for silence that answers
    within ``rejoin_within_s`` joins again (0: never). Outputs of at least
    ``hold_output_min_bytes`` stay on their node (None: all travel by value);
    ``max_output_bytes`` caps each stream of an exec (None: the CPU manager's default)."""

    resource: str = "arl_tangram"
    gpu_resource: str = "arl_tangram_gpu"
    heartbeat_s: float = 0.5
    loss_after_s: float = 3.0
    join_poll_s: float = 1.0
    actor_threads: int = 64
    agent_start_timeout_s: float = 180.0
    retry_start_s: float = 10.0  # after an agent failed to start on a node
    rejoin_within_s: float = 300.0
    hold_output_min_bytes: int | None = DEFAULT_HOLD_MIN_BYTES
    max_output_bytes: int | None = None
    actor_runtime_env: dict[str, Any] | None = None  # e.g. {"env_vars": KEEP_CHILDREN_ENV}
    gpu: GpuSettings = field(default_factory=GpuSettings)


@dataclass
class _Beat:
    last_ok: float  # for a lost node still watched for a comeback: when it was lost
    pending: asyncio.Future[Any] | None = None


class RayMembership:
    """The Ray nodes' agents, as ``controller`` knows them. ``register`` registers the
    services known so far on a new GPU agent (awaited before it joins); ``on_lost`` and
    ``on_join`` are told each change with its wall time (benches time them)."""

    def __init__(
        self, controller: Any, settings: RaySettings, cpu_config: CpuManagerConfig,
        register: Callable[[NodeAgent], Any] | None = None,
    ) -> None:  # fmt: skip
        self.controller = controller
        self.settings = settings
        self.cpu_config = cpu_config
        self.register = register
        self.links: dict[str, NodeLink] = {}  # ray node id -> link (live and lost)
        self.agents: dict[str, NodeAgent] = {}  # ray node id -> agent
        self.beats: dict[str, _Beat] = {}
        self.watched: dict[str, _Beat] = {}  # lost for silence, pinged still: may come back
        self.on_lost: list[Callable[[NodeAgent, float], None]] = []
        self.on_join: list[Callable[[NodeAgent, float], None]] = []
        self._starting: set[str] = set()
        self._failed_at: dict[str, float] = {}  # ray node id -> its agent's last failed start
        self._actor_cls: Any = None

    @property
    def live_agents(self) -> list[NodeAgent]:
        return [a for nid, a in self.agents.items() if not self.links[nid].lost.is_set()]

    async def run(self) -> None:
        """Join and heartbeat loops, until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._join_loop(tg), name="tangram-ray-join")
            tg.create_task(self._heartbeat_loop(tg), name="tangram-ray-heartbeat")

    # -- join ---------------------------------------------------------------------------
    async def discover(self, starts: asyncio.TaskGroup | None = None) -> list[NodeAgent]:
        """Start an agent on every alive offering node without one, at once; returns the
        agents that joined. With ``starts``, the agents start as tasks of that group and
        nothing is awaited (a node slow to start never holds up the next poll). A node whose
        agent fails to start is logged, closed and retried ``retry_start_s`` later. Nodes Ray
        reports dead are declared lost."""
        import ray

        nodes = await asyncio.to_thread(ray.nodes)
        s = self.settings
        fresh = []
        for node in nodes:
            nid, res = node["NodeID"], node.get("Resources", {})
            if not node.get("Alive", False):
                if nid in self.links and not self.links[nid].lost.is_set():
                    self._declare_lost(nid, "Ray reports the node dead", final=True)
                elif nid in self.watched:
                    self._give_up(nid, "Ray reports the node dead")
                continue
            if (
                nid in self.links
                or nid in self._starting
                or not (res.get(s.resource) or res.get(s.gpu_resource))
                or time.monotonic() - self._failed_at.get(nid, -1e9) < s.retry_start_s
            ):
                continue
            fresh.append(
                (
                    nid,
                    bool(res.get(s.resource)),
                    bool(res.get(s.gpu_resource)),
                    int(res.get("GPU", 0)),
                )
            )
        self._starting.update(f[0] for f in fresh)
        if starts is not None:
            for f in fresh:
                starts.create_task(self._start_agent(*f), name=f"tangram-ray-agent:{f[0][:8]}")
            return []
        joined = await asyncio.gather(*(self._start_agent(*f) for f in fresh))
        return [a for a in joined if a is not None]

    async def _start_agent(
        self, ray_node_id: str, cpu: bool, gpu: bool, num_gpus: int
    ) -> NodeAgent | None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        agent_id = f"ray-{ray_node_id[:8]}"
        actor = None
        try:
            if self._actor_cls is None:
                self._actor_cls = actor_class(self.settings.actor_threads)
            actor = self._actor_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id, soft=False),
                num_gpus=num_gpus if gpu else 0, runtime_env=self.settings.actor_runtime_env,
            ).remote(agent_id, self.cpu_config if cpu else None, self.settings.gpu if gpu else None)  # fmt: skip
            report: NodeReport = await asyncio.wait_for(
                actor.report.remote(), self.settings.agent_start_timeout_s
            )
            link, agent = self._link(agent_id, ray_node_id, actor, report, cpu, gpu)
            if gpu and self.register is not None:
                await self.register(agent)
        except asyncio.CancelledError:
            if actor is not None:
                _kill(actor)
            raise
        except Exception:
            log.exception("the agent on Ray node %s failed to start; retrying later", ray_node_id)
            self._failed_at[ray_node_id] = time.monotonic()
            if actor is not None:
                await _close_and_kill(actor)
            return None
        finally:
            self._starting.discard(ray_node_id)
        self._admit(ray_node_id, link, agent)
        return agent

    def _link(
        self,
        agent_id: str,
        ray_node_id: str,
        actor: Any,
        report: NodeReport,
        cpu: bool,
        gpu: bool,
        epoch: int = 0,
    ) -> tuple[NodeLink, NodeAgent]:
        s = self.settings
        verdict_s = s.loss_after_s + 4 * s.heartbeat_s
        link = NodeLink(
            agent_id, ray_node_id, actor, report, verdict_s, s.hold_output_min_bytes, epoch
        )
        agent = NodeAgent(
            agent_id, cpu=RayCpuProxy(link) if cpu else None, gpu=RayGpuProxy(link) if gpu else None,
            host_mem_bytes=report.host_mem_bytes,
        )  # fmt: skip
        return link, agent

    def _admit(self, ray_node_id: str, link: NodeLink, agent: NodeAgent) -> None:
        """The node's capacity becomes schedulable (no await: a concurrent registration of
        a service sees the node either before, and registers there, or after)."""
        self.links[ray_node_id], self.agents[ray_node_id] = link, agent
        self.beats[ray_node_id] = _Beat(time.monotonic())
        self.controller.join(agent)
        log.info(
            "node %s joined (Ray node %s, host %s)",
            agent.node_id,
            ray_node_id,
            link.report.hostname,
        )
        for callback in self.on_join:
            callback(agent, time.time())

    async def _join_loop(self, starts: asyncio.TaskGroup) -> None:
        while True:
            await asyncio.sleep(self.settings.join_poll_s)
            try:
                await self.discover(starts)
            except Exception:  # a GCS hiccup must not end membership
                log.exception("polling Ray's nodes failed")

    # -- heartbeat ------------------------------------------------------------------------
    async def _heartbeat_loop(self, rejoins: asyncio.TaskGroup) -> None:
        while True:
            for nid in self.beat(time.monotonic()):
                rejoins.create_task(self.rejoin(nid), name=f"tangram-ray-rejoin:{nid[:8]}")
            await asyncio.sleep(self.settings.heartbeat_s)

    def beat(self, now: float) -> list[str]:
        """One heartbeat round: read the answers, declare the silent lost, ping the others.
        Returns the lost nodes that answered again (the caller runs ``rejoin`` for each)."""
        comebacks = self._watch(now)
        for nid, beat in list(self.beats.items()):
            link = self.links[nid]
            if link.lost.is_set():
                continue
            pending = beat.pending
            if pending is not None and pending.done():
                beat.pending = None
                if _died(pending):
                    self._declare_lost(nid, f"its agent died ({_why(pending)})", final=True)
                    continue
                if not pending.cancelled() and pending.exception() is None:
                    beat.last_ok = now
                # any other failure (Ray's "actor unavailable" is transient) is a missed beat
            if now - beat.last_ok > self.settings.loss_after_s:
                self._declare_lost(nid, f"no heartbeat for {now - beat.last_ok:.1f} s", now=now)
            elif beat.pending is None:
                beat.pending = _ping(link)
        return comebacks

    def _watch(self, now: float) -> list[str]:
        """Ping the nodes lost for silence; those that answer come back, those whose actor
        died or that stay silent past ``rejoin_within_s`` are given up."""
        comebacks = []
        for nid, watch in list(self.watched.items()):
            pending = watch.pending
            if pending is not None and pending.done():
                watch.pending = None
                if _died(pending):
                    self._give_up(nid, f"its agent died ({_why(pending)})")
                    continue
                if not pending.cancelled() and pending.exception() is None:
                    del self.watched[nid]
                    comebacks.append(nid)
                    continue
            if now - watch.last_ok > self.settings.rejoin_within_s:
                self._give_up(nid, f"silent for {now - watch.last_ok:.1f} s after its loss")
            elif watch.pending is None:
                watch.pending = _ping(self.links[nid])
        return comebacks

    async def rejoin(self, ray_node_id: str) -> NodeAgent | None:
        """Take a lost node that answers again back: its agent drops everything it held and
        reports afresh, the known services are registered on a GPU node, then it joins
        (``NodeJoined``) under its old node ids. A failure gives the node up."""
        old = self.links[ray_node_id]
        try:
            epoch = old.epoch + 1  # calls sent before the pause are refused from now on
            reset = old.actor.reset.remote(epoch)
            report: NodeReport = await asyncio.wait_for(reset, self.settings.agent_start_timeout_s)
            link, agent = self._link(
                old.agent_id, ray_node_id, old.actor, report, report.numa_cores is not None,
                report.device_capacity_bytes is not None, epoch,
            )  # fmt: skip
            if agent.gpu is not None and self.register is not None:
                await self.register(agent)
        except asyncio.CancelledError:
            _kill(old.actor)
            raise
        except Exception as exc:
            log.exception("node %s answered again but could not be taken back", old.agent_id)
            self._give_up(ray_node_id, f"taking it back failed ({type(exc).__name__})")
            return None
        self._admit(ray_node_id, link, agent)
        log.warning(
            "node %s came back after its loss: its old envs stay lost, it joins afresh",
            agent.node_id,
        )
        return agent

    def _give_up(self, ray_node_id: str, why: str) -> None:
        watch = self.watched.pop(ray_node_id, None)
        if watch is not None and watch.pending is not None:
            watch.pending.cancel()
        log.warning("node %s given up: %s", self.links[ray_node_id].agent_id, why)
        _kill(self.links[ray_node_id].actor)

    def _declare_lost(
        self, ray_node_id: str, why: str, *, final: bool = False, now: float | None = None
    ) -> None:
        """The node is lost: its calls end, the core is told. ``final`` (its actor or its
        Ray node is dead): its actor is killed; else it is watched for a comeback."""
        link, agent = self.links[ray_node_id], self.agents[ray_node_id]
        link.declare_lost(f"node {agent.node_id} was lost: {why}")
        beat = self.beats.pop(ray_node_id, None)
        if beat is not None and beat.pending is not None:
            beat.pending.cancel()
        known = {n.node_id for n in self.controller.loop.state.spec.cpu_nodes}
        known |= {n.node_id for n in self.controller.loop.state.spec.gpu_nodes}
        for node_id in (agent.cpu_node_id, agent.gpu_node_id):
            if node_id in known:
                self.controller.post(NodeLost(node_id))
        log.warning("node %s lost: %s", agent.node_id, why)
        if final or self.settings.rejoin_within_s <= 0:
            _kill(link.actor)
        else:  # maybe only paused: watched for a comeback (its actor, alive, keeps its state)
            self.watched[ray_node_id] = _Beat(time.monotonic() if now is None else now)
        for callback in self.on_lost:
            callback(agent, time.time())

    # -- close ----------------------------------------------------------------------------
    async def aclose(self, timeout_s: float = 60.0) -> list[str]:
        """Close every live agent's managers (sandboxes and models destroyed), then end the
        actors. Returns what failed to close."""
        live = [link for link in self.links.values() if not link.lost.is_set()]
        problems: list[str] = []
        results = await asyncio.gather(
            *(asyncio.wait_for(link.actor.close.remote(), timeout_s) for link in live), return_exceptions=True
        )  # fmt: skip
        for link, res in zip(live, results, strict=True):
            if isinstance(res, BaseException):
                problems.append(f"{link.agent_id}: {type(res).__name__}: {res}")
            else:
                problems += [f"{link.agent_id}: {p}" for p in res]
            _kill(link.actor)
        for nid in list(self.watched):  # lost, maybe paused: their keepers clean up after them
            self._give_up(nid, "the controller closed")
        return problems


def _ping(link: NodeLink) -> asyncio.Future[Any]:
    pending = asyncio.wrap_future(link.actor.ping.remote().future())
    pending.add_done_callback(_retrieve)  # read even when nobody waits any more
    return pending


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _died(future: asyncio.Future[Any]) -> bool:
    """Whether a ping failed because the actor is dead for good (not just unreachable)."""
    if future.cancelled() or future.exception() is None:
        return False
    from ray.exceptions import ActorDiedError

    return isinstance(future.exception(), ActorDiedError)


def _why(future: asyncio.Future[Any]) -> str:
    if future.cancelled():
        return "cancelled"
    exc = future.exception()
    return type(exc).__name__ if exc is not None else "ok"


async def _close_and_kill(actor: Any) -> None:
    """End an agent that failed to start: its managers first (best effort), then its actor."""
    try:
        await asyncio.wait_for(actor.close.remote(), 30.0)
    except Exception:  # noqa: BLE001 - dead or hung: the kill below ends it
        log.debug("closing a failed agent failed", exc_info=True)
    _kill(actor)


def _kill(actor: Any) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already dead, or Ray is shutting down
        log.debug("killing an agent actor failed", exc_info=True)
