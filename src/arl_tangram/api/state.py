"""Shell: what the API layer keeps beside the controller: tenant scoping of ids, the bound
on pending actions, session ownership.

Who calls: the route handlers, on the server's event loop (the controller's loop), so
nothing here is locked. Ids are scoped per tenant: the internal id of a tenant's env or
action is ``f"{prefix}.{external_id}"``, the prefix being the tenant's name, or a hash of
it when the name is not a short word of ``[A-Za-z0-9_-]`` (so the split is unambiguous
and the internal id is still a valid sandbox id); a tenant's own services are
``f"~{tenant}/{name}"``, a prefix no operator-registered name can take. Looking an id up
always goes through ``scoped``, so another tenant's id is simply not found (404).
Idempotency, result retention and env leases are the controller's (``submit(...,
request_id=)``, ``ack``, ``renew_env``); the API only maps them.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import time
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from arl_tangram.api.edge import BodyLimits
from arl_tangram.api.metrics import ApiMetrics
from arl_tangram.core.action import ActionSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import ActionRecord, Payload
from arl_tangram.runtime.config import ConfigError
from arl_tangram.runtime.embedded import EmbeddedRuntime

DEFAULT_TENANT = "default"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,16}$")
DEFAULT_MAX_QUEUED_ACTIONS = 10_000
DEFAULT_CREATE_TIMEOUT_S = 120.0
T = TypeVar("T")


class NotFound(LookupError):
    """An id that this tenant does not own (or that does not exist): always a 404."""

    def __init__(self, field: str, value: str) -> None:
        super().__init__(f"{field}: must name one of this tenant's live objects (got {value!r})")
        self.field = field
        self.value = value


class Conflict(SpecError):
    """Well-formed input that the current state refuses (a duplicate id): always a 409."""


class Gone(LookupError):
    """The tenant's own env was released because its lease ran out: 410, saying when."""

    def __init__(self, field: str, value: str, rule: str) -> None:
        super().__init__(f"{field}: {rule} (got {value!r})")
        self.field, self.value, self.rule = field, value, rule


class Overloaded(RuntimeError):
    """The bound on pending actions is reached: 503 with ``Retry-After``."""

    def __init__(self, rule: str, retry_after_s: float) -> None:
        super().__init__(rule)
        self.rule = rule
        self.retry_after_s = retry_after_s


def _describe(expired: Any) -> str:
    idle_s, at = getattr(expired, "idle_s", None), getattr(expired, "expired_wall_s", None)
    if idle_s is None or at is None:
        return "idle TTL"
    return f"idle for {idle_s:.0f} s, released at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(at))}"


def check_tenant_name(name: str, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(where, "must be a non-empty tenant name", name)
    return name


@functools.lru_cache(maxsize=4096)
def tenant_prefix(tenant: str) -> str:
    """The id prefix of a tenant: its name when that is a short sandbox-id-safe word (no
    dot, so the split is unambiguous), else ``t-`` and a hash of it; internal ids stay
    valid sandbox ids (``[A-Za-z0-9._-]``, at most 64 characters)."""
    if TENANT_PATTERN.match(tenant):
        return tenant
    return "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:14]


def new_id(prefix: str) -> str:
    """A server-generated id: uuid4-based, so another tenant cannot guess it."""
    return f"{prefix}-{uuid.uuid4().hex}"


def wall_time_of(monotonic_s: float) -> float:
    """Unix seconds of a ``time.monotonic`` reading (the controller's clock)."""
    return time.time() - (time.monotonic() - monotonic_s)


class ApiState:
    """The API's view of one running ``EmbeddedRuntime``; created by ``create_app``."""

    def __init__(
        self,
        runtime: EmbeddedRuntime,
        *,
        tokens: Mapping[str, str],
        max_queued_actions: int,
        shared_services: frozenset[str],
    ) -> None:
        self.runtime = runtime
        self.controller = runtime.controller
        self.tokens = dict(tokens)  # token -> tenant; empty: unauthenticated, tenant "default"
        self.max_queued_actions = max_queued_actions
        self.shared_services = set(shared_services)
        self.pending: set[str] = set()  # internal ids of unfinished actions submitted here
        self.sessions: dict[str, set[str]] = {}  # internal env id -> its open session ids
        self.closing = False
        self.on_done: list[Any] = []  # callbacks(record) when an action submitted here ends
        self.metrics: ApiMetrics = ApiMetrics()
        self.create_timeout_s = DEFAULT_CREATE_TIMEOUT_S
        self.body_limits = BodyLimits()  # read by the edge on every request
        self.e2b_prefix: str | None = None  # where the E2B face is served (its credentials differ)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def begin_stopping(self) -> None:
        """The server is stopping: new submissions get 503, waits answer now (idempotent)."""
        self.closing = True
        if not self.stopping.done():
            self.stopping.set_result(None)

    # -- work that outlives a request -------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task tracked until it ends (``drain`` awaits the rest at shutdown); its failure
        is read by whoever awaits it, else dropped here (it has reached nobody)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled():
            task.exception()  # marks it retrieved

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    # -- ids ------------------------------------------------------------------------------
    @staticmethod
    def scoped(tenant: str, external_id: str) -> str:
        return f"{tenant_prefix(tenant)}.{external_id}"

    @staticmethod
    def external(tenant: str, internal_id: str) -> str:
        return internal_id[len(tenant_prefix(tenant)) + 1 :]

    @staticmethod
    def private_service(tenant: str, name: str) -> str:
        return f"~{tenant}/{name}"

    # -- envs -----------------------------------------------------------------------------
    def env_internal(self, tenant: str, env_id: str) -> str:
        """The internal id of a live env of ``tenant``; ``NotFound`` otherwise. Renews the
        env's lease when the runtime keeps leases (any use of an env renews it)."""
        internal = self.scoped(tenant, env_id)
        if internal not in self.controller.env_specs:
            expired = self.controller.expired_env(internal)
            if expired is not None:
                raise Gone("env_id", env_id, f"was released: its lease ran out ({_describe(expired)})")
            raise NotFound("env_id", env_id)
        try:
            self.controller.renew_env(internal)
        except SpecError:
            raise NotFound("env_id", env_id) from None
        return internal

    def envs_of(self, tenant: str) -> list[str]:
        prefix = f"{tenant_prefix(tenant)}."
        return sorted(e for e in self.controller.env_specs if e.startswith(prefix))

    def max_env_mem_bytes(self) -> int:
        nodes = self.controller.loop.state.spec.cpu_nodes
        return max((n.mem_bytes for n in nodes), default=0)

    # -- services -------------------------------------------------------------------------
    def service_internal(self, tenant: str, name: str) -> str | None:
        """The service ``name`` resolves to for ``tenant``: its own first, then a shared one."""
        services = self.controller.loop.state.spec.services
        private = self.private_service(tenant, name)
        if private in services:
            return private
        if name in self.shared_services and name in services:
            return name
        return None

    def services_of(self, tenant: str) -> list[tuple[str, str, bool]]:
        """(external name, internal name, shared) of every service ``tenant`` may call."""
        services = self.controller.loop.state.spec.services
        prefix = f"~{tenant}/"
        own = [(n[len(prefix) :], n, False) for n in services if n.startswith(prefix)]
        shared = [(n, n, True) for n in services if n in self.shared_services]
        return sorted(own + shared)

    # -- actions --------------------------------------------------------------------------
    def record(self, tenant: str, action_id: str) -> ActionRecord:
        """The record of one of ``tenant``'s actions; ``NotFound`` otherwise."""
        record = self.controller.get(self.scoped(tenant, action_id))
        if record is None or record.spec.tenant != tenant:
            raise NotFound("action_id", action_id)
        return record

    def submit(self, spec: ActionSpec, payload: Payload, request_id: str | None) -> ActionRecord:
        """Hand an action to the controller, within the bound on pending actions. The same
        (tenant, request id) again returns the first record (the controller's idempotency)."""
        if self.closing:
            raise Overloaded("the service is shutting down", 5.0)
        if len(self.pending) >= self.max_queued_actions:
            raise Overloaded(f"at most max_queued_actions={self.max_queued_actions} actions may be pending", 1.0)
        record = self.controller.submit(spec, payload, request_id=request_id)
        action_id = record.spec.action_id
        if record.result is None and action_id not in self.pending:
            self.pending.add(action_id)
            record.done.add_done_callback(lambda _f: self._ended(record))
        return record

    def _ended(self, record: ActionRecord) -> None:
        self.pending.discard(record.spec.action_id)
        for callback in self.on_done:
            callback(record)

    def ack(self, record: ActionRecord) -> None:
        """The owner has the result: drop it (idempotent)."""
        self.controller.ack(record.spec.action_id)
