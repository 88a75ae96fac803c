"""Shell: snapshot, fork and rollback of envs through the controller, as scheduled actions.

``snapshot`` and ``rollback`` are actions of their env (``core.snapshots``: queued behind
the env's running action, alone on it while they run, ACT split recorded like any action's);
the node agent does the work (``agent.snapshots``). ``fork(n)`` is a snapshot, then ``n``
child envs whose specs name it (``EnvSpec.snapshot``, ``fork_of``): the core places each on
the parent's node and holds its memory like any env's, so a burst of forks waits for
capacity instead of overrunning the node; a fork whose children can never fit on the node is
refused before anything runs. Snapshots have a lease (``ttl_s``, renewed by use), like envs.

Errors are ``SpecError`` s naming the field and the rule: plain (bad input: 422),
``SnapshotNotFoundError`` (no such env or snapshot, or another tenant's: 404),
``SnapshotInUseError`` (a pinned snapshot: 409).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from arl_tangram.agent.node import NodeAgent
from arl_tangram.agent.snapshots import SnapshotInUseError, SnapshotNotFoundError
from arl_tangram.core.action import ActionSpec
from arl_tangram.core.decisions import StartAction
from arl_tangram.core.env_spec import EnvSpec, check_snapshot_id
from arl_tangram.core.errors import SpecError
from arl_tangram.core.snapshots import exclusive_action
from arl_tangram.runtime.actions import ActionRecord, ActionResult, Payload, SnapshotPayload
from arl_tangram.runtime.blocking import BlockingRunner
from arl_tangram.runtime.config_images import SnapshotSettings
from arl_tangram.runtime.loop import Clock, ControllerLoop

MAX_NAME_CHARS = 128


async def run_snapshot(ex: BlockingRunner, agent: NodeAgent, record: ActionRecord, d: StartAction, p: SnapshotPayload) -> tuple[ActionResult, float]:
    """The ``snapshot`` or ``rollback`` action on the agent's node (blocking work on a worker
    thread). A refusal (a rule, an unknown snapshot) ends it ``rejected`` naming the field."""
    snaps, cpu, spec = agent.snapshots, agent.cpu, record.spec
    t0 = time.monotonic()
    try:
        if snaps is None or cpu is None:
            raise SpecError(spec.kind, f"node {d.node_id} keeps no snapshots (no [images] store)", spec.binding.name)
        if spec.kind == "snapshot":
            out = await ex.blocking(snaps.take, cpu, spec.binding.name, spec.tenant, p.name, p.snapshot_id)
        else:
            out = await ex.blocking(snaps.rollback, cpu, spec.binding.name, spec.tenant, p.snapshot_id)
    except SpecError as exc:
        error = "not_found" if isinstance(exc, SnapshotNotFoundError) else "invalid"
        refused = {"error": error, "field": exc.field, "rule": exc.rule}
        return ActionResult(d.action_id, spec.kind, "rejected", output=refused, cause=str(exc)), 0.0
    exec_s = time.monotonic() - t0
    return ActionResult(d.action_id, spec.kind, "succeeded", output=public(out.to_json())), exec_s


def public(meta: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as clients see it (its stack and image config are the node's business)."""
    keys = ("snapshot_id", "env_id", "name", "tenant", "image", "dirty_bytes", "ancestors", "squash_ms", "created_s")
    out = {k: meta[k] for k in keys}
    out["depth"] = len(meta["stack"])
    out["ancestors"] = list(out["ancestors"])
    return out


class SnapshotHost(Protocol):
    """What snapshot, fork and rollback need of the controller (``Controller`` is one)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def loop(self) -> ControllerLoop: ...

    @property
    def env_specs(self) -> dict[str, EnvSpec]: ...

    @property
    def node_agents(self) -> Sequence[NodeAgent]: ...

    def submit(self, spec: ActionSpec, payload: Payload, *, request_id: str | None = None) -> ActionRecord: ...

    async def wait(self, action_id: str, timeout_s: float | None = None) -> ActionResult: ...

    def ack(self, action_id: str) -> bool: ...

    async def create_env(self, spec: EnvSpec) -> None: ...

    def release_env(self, env_id: str) -> None: ...


class SnapshotService:
    """The controller's snapshot calls. One per controller (``Controller.snapshots``)."""

    def __init__(self, controller: SnapshotHost, settings: SnapshotSettings | None = None) -> None:
        self.c = controller
        self.settings = settings or SnapshotSettings()
        self.leases: dict[str, float] = {}  # snapshot id -> expiry (controller clock)

    def _env(self, env_id: str, tenant: str) -> EnvSpec:
        spec = self.c.env_specs.get(env_id)
        if spec is None or spec.tenant != tenant or env_id not in self.c.loop.state.envs:
            raise SnapshotNotFoundError("env_id", "must name a live env of this tenant (released, expired or never created)", env_id)
        return spec

    def _agents(self) -> list[Any]:
        return [a for a in self.c.node_agents if a.snapshots is not None]

    async def _act(self, kind: str, env_id: str, tenant: str, payload: SnapshotPayload) -> dict[str, Any]:
        spec = self._env(env_id, tenant)
        action = exclusive_action(f"{kind}-{secrets.token_hex(6)}", kind, env_id, tenant, spec.trajectory_id)
        self.c.submit(action, payload)
        result = await self.c.wait(action.action_id)
        self.c.ack(action.action_id)
        refused = result.output if result.outcome == "rejected" and isinstance(result.output, dict) else None
        if refused is not None:
            error = SnapshotNotFoundError if refused.get("error") == "not_found" else SpecError
            raise error(refused["field"], refused["rule"], payload.snapshot_id if kind == "rollback" else env_id)
        if result.outcome == "rejected":  # the core's: its env went away meanwhile
            raise SnapshotNotFoundError("env_id", f"must name a live env ({result.cause})", env_id)
        if not result.ok:
            raise RuntimeError(f"{kind} of env {env_id} ended {result.outcome}: {result.cause}")
        out = dict(result.output)
        out["act"] = {"queue_s": result.queue_s, "exec_s": result.exec_s, "overhead_s": result.overhead_s}
        self.leases[out["snapshot_id"]] = self.c.clock.now() + self.settings.ttl_s
        return out

    async def snapshot(self, env_id: str, tenant: str, name: str | None = None) -> dict[str, Any]:
        """Freeze the env's filesystem as a new snapshot (the env goes on on top of it)."""
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
            raise SpecError("name", f"must be a string of at most {MAX_NAME_CHARS} characters", name)
        sid = f"snap-{secrets.token_hex(8)}"
        return await self._act("snapshot", env_id, tenant, SnapshotPayload(sid, name or ""))

    async def rollback(self, env_id: str, tenant: str, snapshot_id: str) -> dict[str, Any]:
        """Put the env back to a snapshot it descends from (fresh writable layer)."""
        self.get(check_snapshot_id(snapshot_id), tenant)
        return await self._act("rollback", env_id, tenant, SnapshotPayload(snapshot_id))

    async def fork(self, env_id: str, tenant: str, count: object) -> list[EnvSpec]:
        """``count`` children of the env as it is now: a snapshot, then one env per child."""
        top = self.settings.max_fork_count
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= top:
            raise SpecError("count", "must be an integer in [1, max_fork_count]", {"count": count, "max_fork_count": top})
        parent = self._env(env_id, tenant)
        self._check_fits(parent, count)
        snap = await self.snapshot(env_id, tenant, f"fork of {env_id}")
        return await self.create_children(parent, snap["snapshot_id"], count)

    async def create_children(self, parent: EnvSpec, snapshot_id: str, count: int) -> list[EnvSpec]:
        specs = [
            replace(parent, env_id=f"{parent.env_id}-f{secrets.token_hex(4)}", snapshot=snapshot_id, fork_of=parent.env_id)
            for _ in range(count)
        ]  # fmt: skip
        done = await asyncio.gather(*(self.c.create_env(s) for s in specs), return_exceptions=True)
        failed = [r for r in done if isinstance(r, BaseException)]
        if failed:
            for s, r in zip(specs, done, strict=True):
                if not isinstance(r, BaseException):
                    self.c.release_env(s.env_id)
            raise failed[0]
        return specs

    def _check_fits(self, parent: EnvSpec, count: int) -> None:
        env = self.c.loop.state.envs.get(parent.env_id)
        node = next((n for n in self.c.loop.state.spec.cpu_nodes if env is not None and n.node_id == env.node_id), None)
        if node is not None and count * parent.mem_bytes > node.mem_bytes:
            raise SpecError("count", f"{count} children of {parent.mem_bytes} bytes can never fit on node {node.node_id} "
                            f"({node.mem_bytes} bytes for envs)", count)  # fmt: skip

    def spec_from(self, snapshot_id: str, tenant: str, spec: EnvSpec) -> EnvSpec:
        """``spec`` (made by a client) set to start from ``snapshot_id``: its image and node."""
        meta = self.get(snapshot_id, tenant)
        live = meta["env_id"] in self.c.env_specs
        return replace(spec, image=meta["image"], layers=(), snapshot=snapshot_id, fork_of=meta["env_id"] if live else "")

    # -- the catalog ----------------------------------------------------------------------
    def get(self, snapshot_id: str, tenant: str | None) -> dict[str, Any]:
        for agent in self._agents():
            try:
                record = agent.snapshots.get(snapshot_id, tenant)
            except SnapshotNotFoundError:
                continue
            self.leases[snapshot_id] = self.c.clock.now() + self.settings.ttl_s  # a use renews it
            return {**record.to_json(), "node_id": agent.node_id}
        raise SnapshotNotFoundError("snapshot_id", "must name a snapshot of this tenant", snapshot_id)

    def catalog(self, tenant: str | None) -> list[dict[str, Any]]:
        self.expire()
        out = []
        for agent in self._agents():
            for record in agent.snapshots.store.list():
                if tenant is None or record.tenant == tenant:
                    out.append(public(record.to_json()))
        return out

    def delete(self, snapshot_id: str, tenant: str | None) -> None:
        check_snapshot_id(snapshot_id)
        self.get(snapshot_id, tenant)
        for agent in self._agents():
            try:
                agent.snapshots.delete(snapshot_id, tenant)
            except SnapshotNotFoundError:
                continue
        self.leases.pop(snapshot_id, None)

    def expire(self) -> list[str]:
        """Delete the snapshots whose lease ran out and that nothing pins; returns them. A
        snapshot found on disk after a restart gets a fresh lease."""
        now, gone = self.c.clock.now(), []
        for agent in self._agents():
            for record in agent.snapshots.store.list():
                sid = record.snapshot_id
                if self.leases.setdefault(sid, now + self.settings.ttl_s) > now:
                    continue
                try:
                    agent.snapshots.delete(sid, None)
                except SnapshotInUseError:  # pinned: kept, looked at again next time
                    continue
                self.leases.pop(sid, None)
                gone.append(sid)
        return gone
