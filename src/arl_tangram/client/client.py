"""Shell: the SDK rollouts are written against: ``AsyncClient``, its ``Env`` s and sessions.

Every call becomes one action that ARL-Tangram schedules (an exec, a session command, a
service call, an API call), except host-side file calls, which need no CPU and work while
the env is frozen. Results are ``ActionResult`` s whatever the outcome; bad input raises
``SpecError`` naming the field and the rule, before anything is queued.

``retryable=True`` (on ``call``, ``Env.exec`` and ``Session.run``) tells ARL-Tangram that
running the action twice is harmless: if its node is lost mid-run it is retried on another
node (a bounded number of times) instead of ending ``error`` / ``node_lost``; an env's
action is not retried when its env went with the node. ``result.attempts`` says how often.

``deadline_s`` (on ``Env.exec`` and ``Session.run``): seconds after submission by which the
caller needs the result. An action that can no longer start in time (its ``timeout_s``
counted) is not run: its result is ``rejected`` with ``cause`` starting ``deadline:``
(``ActionResult.deadline_missed``), retryable later, as every other rejection is a result.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arl_tangram.client.snapshot import Snapshot, snapshot_id_of
from arl_tangram.client.transport import Transport
from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.elasticity import Amdahl, ElasticityModel, NonElastic, Table
from arl_tangram.core.env_spec import check_image_reference
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import (
    ActionResult,
    ApiPayload,
    ExecPayload,
    NoopPayload,
    ServicePayload,
)
from arl_tangram.runtime.config import ServiceConfig, parse_size_bytes

ONE_CORE = ResourceVector(cpu_millicores=1000)


@dataclass(frozen=True)
class Elastic:
    """An action's DoP range and, optionally, its curve: an Amdahl ``serial_fraction`` or a
    ``table`` of efficiencies E(1), E(2), ... Without a curve, the kind's learned one is used."""

    min: int = 1
    max: int = 1
    serial_fraction: float | None = None
    table: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("min", "max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"cpu.{name}", "must be an integer >= 1", value)
        if self.min > self.max:
            raise SpecError("cpu.min", "must be <= cpu.max", (self.min, self.max))
        if self.serial_fraction is not None and self.table is not None:
            raise SpecError("cpu", "give serial_fraction or table, not both", (self.serial_fraction, self.table))

    def model(self) -> ElasticityModel | None:
        if self.serial_fraction is not None:
            return Amdahl(self.serial_fraction)
        if self.table is not None:
            return Table(tuple(self.table))
        return None


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _dop(cpu: Elastic | int | None) -> Elastic:
    if cpu is None:
        return Elastic(1, 1, serial_fraction=1.0)
    if isinstance(cpu, Elastic):
        return cpu
    if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 1:
        raise SpecError("cpu", "must be an integer >= 1 or an Elastic(min, max)", cpu)
    return Elastic(cpu, cpu, serial_fraction=1.0 if cpu == 1 else 0.0)


class AsyncClient:
    """The rollout's handle on ARL-Tangram. ``async with connect() as tg: ...``"""

    def __init__(self, transport: Transport, *, tenant: str = "default") -> None:
        self.transport = transport
        self.tenant = tenant

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def create_env(
        self, *, image: str = "host", memory: str | int = "1GiB", pids_max: int = 512,
        workspace: str | int = "512MiB", tmp: str | int = "256MiB", writable: str | int = "1GiB", trajectory_id: str = "",
        env_id: str | None = None, snapshot: Snapshot | str | None = None,
    ) -> Env:  # fmt: skip
        """A stateful sandbox at zero CPU while idle; its memory is held for its life.

        ``image``: ``host`` (or ``python``), the host's read-only root; or an OCI image, as a
        registry reference (``127.0.0.1:5000/swe/task:1``) or an id (``sha256:...``), pulled
        onto the env's node first if that node lacks its layers. ``writable`` caps the
        image env's own writable layer. Raises ``SpecError`` naming a bad field, and
        ``EnvFailedError`` with the cause (a failed pull names the layer and the
        registry's answer).

        ``snapshot``: start from a snapshot's filesystem instead (on its image and its node;
        ``image`` is then ignored): a new writable layer over the snapshot's, no copy."""
        sid = ""
        if snapshot is not None:
            sid = snapshot_id_of(snapshot)
            image = str((await self.transport.get_snapshot(sid, self.tenant))["image"])
        spec = EnvSpec(
            env_id or _new_id("env"), parse_size_bytes(memory, "memory"), self.tenant, trajectory_id, image=image,
            pids_max=pids_max, workspace_bytes=parse_size_bytes(workspace, "workspace"), tmp_bytes=parse_size_bytes(tmp, "tmp"),
            writable_bytes=parse_size_bytes(writable, "writable"), snapshot=sid,
        )  # fmt: skip
        await self.transport.create_env(spec)
        return Env(self, spec.env_id, trajectory_id)

    async def list_snapshots(self) -> list[Snapshot]:
        """This tenant's snapshots, oldest first."""
        return [Snapshot.from_json(s) for s in await self.transport.list_snapshots(self.tenant)]

    async def get_snapshot(self, snapshot: Snapshot | str) -> Snapshot:
        """A snapshot by id; ``SpecError`` naming ``snapshot_id`` when there is none (or it is
        another tenant's)."""
        return Snapshot.from_json(await self.transport.get_snapshot(snapshot_id_of(snapshot), self.tenant))

    async def delete_snapshot(self, snapshot: Snapshot | str) -> None:
        """Delete a snapshot; refused (``SpecError`` naming ``snapshot_id``) while a live env
        or another snapshot stands on it."""
        await self.transport.delete_snapshot(snapshot_id_of(snapshot), self.tenant)

    async def prefetch(self, images: Sequence[str] | str, *, nodes: Sequence[str] = ()) -> None:
        """Pull ``images`` onto ``nodes`` (node ids, e.g. ``local/cpu``; every node when
        empty) ahead of the envs that will need them: warm the next batch's images while
        this one runs. Returns once the pulls are ordered (one per node lacking layers)."""
        for image in [images] if isinstance(images, str) else list(images):
            await self.transport.prefetch(check_image_reference(image), nodes)

    async def call(
        self, name: str, request: Any, *, timeout_s: float | None = None, tokens: int | None = None,
        method: str = "POST", path: str = "/", devices: Elastic | None = None, retryable: bool = False,
    ) -> ActionResult:  # fmt: skip
        """Call a GPU service (``reward/minilm``) or an API provider (``api/search`` or its
        bare name): one action, queued until its resources are free."""
        provider = name.removeprefix("api/")
        service = self.transport.service_spec(name)
        if service is not None:
            lo, hi = (devices.min, devices.max) if devices else (service.devices_min, service.devices_max)
            spec = ActionSpec(
                _new_id("call"), service.name, Binding("service", service.name), self.tenant,
                demand_per_unit=ResourceVector(gpu_devices=1), key=ResourceKind.GPU, dop_min=lo, dop_max=hi,
                timeout_s=timeout_s, retryable=retryable,
            )  # fmt: skip
            return await self.transport.run_action(spec, ServicePayload(request), timeout_s)
        if self.transport.has_provider(provider):
            spec = ActionSpec(
                _new_id("api"), f"api:{provider}", Binding("api", provider), self.tenant,
                demand_fixed=ResourceVector(quota_tokens=1), timeout_s=timeout_s, retryable=retryable,
            )  # fmt: skip
            payload = ApiPayload(method, path, request, tokens=tokens, timeout_s=timeout_s or 60.0)
            return await self.transport.run_action(spec, payload, None)
        raise SpecError("name", "must name a registered service or a configured API provider", name)

    async def ping(self) -> ActionResult:
        """An action that needs no resource: proves the controller schedules and answers."""
        spec = ActionSpec(_new_id("noop"), "noop", tenant=self.tenant)
        return await self.transport.run_action(spec, NoopPayload())

    async def register_service(
        self, name: str, *, handler: str, folder: str | None = None, module: str | None = None,
        devices_min: int = 1, devices_max: int = 1, max_batch: int | None = None, max_context_tokens: int | None = None,
    ) -> None:  # fmt: skip
        """Register a model (local safetensors folder, or ``pkg.mod:factory``) as a service;
        a ``generate`` service takes its KV cache sizing (``max_batch``, ``max_context_tokens``)."""
        config = ServiceConfig(name, handler, folder, module, devices_min, devices_max, None, max_batch, max_context_tokens)
        await self.transport.register_service(config)


class Env:
    """A stateful sandbox. Actions on it run one after another or at once, each with its
    own grant; ``release()`` (or leaving ``async with``) gives it back."""

    def __init__(self, client: AsyncClient, env_id: str, trajectory_id: str) -> None:
        self.client = client
        self.env_id = env_id
        self.trajectory_id = trajectory_id
        self.released = False

    async def __aenter__(self) -> Env:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await self.client.transport.release_env(self.env_id)

    def _spec(
        self, kind: str, cpu: Elastic | int | None, timeout_s: float | None, t_ori_s: float | None, retryable: bool = False,
        memory: int | str | None = None, deadline_s: float | None = None,
    ) -> ActionSpec:  # fmt: skip
        dop = _dop(cpu)
        model = dop.model() or self.client.transport.learned_model(kind)
        return ActionSpec(
            _new_id("act"), kind, Binding("env", self.env_id), self.client.tenant, self.trajectory_id,
            demand_per_unit=ONE_CORE, key=ResourceKind.CPU, dop_min=dop.min, dop_max=dop.max,
            elasticity=model if dop.max > 1 else NonElastic(), t_ori_s=t_ori_s, timeout_s=timeout_s,
            retryable=retryable, memory_bytes=None if memory is None else parse_size_bytes(memory, "memory"),
            deadline_s=deadline_s,
        )  # fmt: skip

    async def exec(
        self, command: str | list[str], *, cpu: Elastic | int | None = None, stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None, cwd: str | None = None, timeout_s: float = 60.0,
        kind: str = "exec", t_ori_s: float | None = None, retryable: bool = False, memory: int | str | None = None,
        deadline_s: float | None = None,
    ) -> ActionResult:  # fmt: skip
        """Run a ``bash -c`` string or an argv with the cores the scheduler grants within
        ``cpu`` (``TANGRAM_DOP`` and ``nproc`` say how many). ``memory`` (bytes or "3GiB"):
        its memory demand above the env's idle footprint, at most the env's limit (else
        learned per kind, else the limit); over it, it pauses while the node finds more.
        ``deadline_s``: see the module doc."""
        spec = self._spec(kind, cpu, timeout_s, t_ori_s, retryable, memory, deadline_s)
        stdin_bytes = stdin.encode() if isinstance(stdin, str) else stdin
        argv = command if isinstance(command, str) else tuple(command)
        payload = ExecPayload(argv, stdin_bytes, tuple(sorted((env or {}).items())), cwd, timeout_s)
        return await self.client.transport.run_action(spec, payload)

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self.client.transport.write_file(self.env_id, path, data.encode() if isinstance(data, str) else bytes(data))

    async def read_file(self, path: str) -> bytes:
        return await self.client.transport.read_file(self.env_id, path)

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Freeze this env's filesystem (root changes, ``/workspace``, ``/tmp``) as a read-only
        snapshot, as an action queued behind the env's running one; the env goes on on top of
        it. Process state is not part of a snapshot: the env's sandbox restarts on the new
        layers (same working directory), so it is refused while a session is open. Image
        envs only (``SpecError`` naming ``snapshot`` on the host root)."""
        return Snapshot.from_json(await self.client.transport.snapshot(self.env_id, self.client.tenant, name))

    async def fork(self, n: int) -> list[Env]:
        """``n`` new envs whose filesystems start as this env's is now (a snapshot, then one
        fresh writable layer per child over it: no copy); on this env's node. Each child's
        writes are its own. ``count`` is 1..``max_fork_count``."""
        ids = await self.client.transport.fork(self.env_id, self.client.tenant, n)
        return [Env(self.client, env_id, self.trajectory_id) for env_id in ids]

    async def rollback(self, snapshot: Snapshot | str) -> None:
        """Put this env back to a snapshot it descends from (a fresh writable layer over it)."""
        await self.client.transport.rollback(self.env_id, self.client.tenant, snapshot_id_of(snapshot))

    async def session(self, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> Session:
        """A persistent bash (cwd, variables and shell state kept across commands)."""
        session_id = await self.client.transport.open_session(self.env_id, env, cwd)
        return Session(self, session_id)


class Session:
    """A bash session inside an env; each ``run`` is an action with its own grant."""

    def __init__(self, env: Env, session_id: str) -> None:
        self.env = env
        self.session_id = session_id

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self, command: str, *, cpu: Elastic | int | None = None, timeout_s: float = 60.0, kind: str = "session",
        retryable: bool = False, memory: int | str | None = None, deadline_s: float | None = None,
    ) -> ActionResult:  # fmt: skip
        spec = self.env._spec(kind, cpu, timeout_s, None, retryable, memory, deadline_s)
        payload = ExecPayload(command, None, (), None, timeout_s, session_id=self.session_id)
        return await self.env.client.transport.run_action(spec, payload)

    async def close(self) -> None:
        await self.env.client.transport.close_session(self.env.env_id, self.session_id)
