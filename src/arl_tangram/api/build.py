"""Shell: a validated request body -> the ``ActionSpec`` and payload the controller takes.

No policy here: the demand of each kind of action is the SDK's (one core per unit of an
env action's DoP, one device per unit of a service call's, one quota token per API call),
so an action costs the same whether it came in process or over HTTP. The tenant comes from
the caller's token, never from the body; ids and bindings are tenant-scoped.
"""

from __future__ import annotations

import base64
import binascii

from arl_tangram.api.schemas import (
    ApiAction,
    CodeAction,
    Elasticity,
    ExecAction,
    NoopAction,
    ServiceAction,
)
from arl_tangram.api.state import ApiState, NotFound, new_id
from arl_tangram.client.client import ONE_CORE, Elastic
from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.elasticity import NonElastic
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import (
    ApiPayload,
    ExecPayload,
    NoopPayload,
    Payload,
    ServicePayload,
)
from arl_tangram.runtime.config import parse_size_bytes

ActionBody = ExecAction | CodeAction | ServiceAction | ApiAction | NoopAction
INTERPRETERS = {"python": ("python3", "-"), "bash": ("bash", "-s")}


def build(state: ApiState, tenant: str, body: ActionBody) -> tuple[ActionSpec, Payload, str]:
    """(spec, payload, external action id). ``NotFound`` for an env, session or service
    the tenant does not have; ``SpecError`` naming the field for a rule the core enforces."""
    external_id = body.action_id or new_id("act")
    action_id = state.scoped(tenant, external_id)
    if isinstance(body, ExecAction | CodeAction):
        return (*_env_action(state, tenant, action_id, body), external_id)
    if isinstance(body, ServiceAction):
        internal = state.service_internal(tenant, body.service)
        if internal is None:
            raise NotFound("service", body.service)
        service = state.controller.loop.state.spec.services[internal]
        lo, hi = (body.devices.min, body.devices.max) if body.devices else (service.devices_min, service.devices_max)
        spec = ActionSpec(
            action_id, internal, Binding("service", internal), tenant, body.trajectory_id,
            demand_per_unit=ResourceVector(gpu_devices=1), key=ResourceKind.GPU, dop_min=lo, dop_max=hi,
            timeout_s=body.timeout_s, retryable=body.retryable,
        )  # fmt: skip
        return spec, ServicePayload(body.request), external_id
    if isinstance(body, ApiAction):
        if state.controller.loop.state.spec.quota_pool(body.provider) is None:
            raise NotFound("provider", body.provider)
        spec = ActionSpec(
            action_id, f"api:{body.provider}", Binding("api", body.provider), tenant, body.trajectory_id,
            demand_fixed=ResourceVector(quota_tokens=1), timeout_s=body.timeout_s, retryable=body.retryable,
        )  # fmt: skip
        params = tuple(sorted((body.params or {}).items()))
        payload = ApiPayload(body.method, body.path, body.json_body, params, body.tokens, body.timeout_s or 60.0)
        return spec, payload, external_id
    spec = ActionSpec(action_id, body.kind or "noop", tenant=tenant, trajectory_id=body.trajectory_id, retryable=body.retryable)
    return spec, NoopPayload(), external_id


def _env_action(state: ApiState, tenant: str, action_id: str, body: ExecAction | CodeAction) -> tuple[ActionSpec, Payload]:
    env_id = state.env_internal(tenant, body.env_id)
    timeout_s = body.timeout_s or 60.0
    if isinstance(body, CodeAction):
        kind = body.kind or f"code:{body.language}"
        payload: Payload = ExecPayload(INTERPRETERS[body.language], body.code.encode(), (), None, timeout_s)
    else:
        kind = body.kind or ("session" if body.session_id else "exec")
        if body.session_id is not None and body.session_id not in state.sessions.get(env_id, ()):
            raise NotFound("session_id", body.session_id)
        command = body.command if isinstance(body.command, str) else tuple(body.command)
        if body.session_id is not None and not isinstance(command, str):
            raise SpecError("command", "must be a string in a session (a bash command line)", body.command)
        env = tuple(sorted((body.env or {}).items()))
        payload = ExecPayload(command, _stdin(body), env, body.cwd, timeout_s, body.session_id)
    dop = _elastic(body.cpu)
    model = dop.model() or state.controller.learned_model(kind)
    spec = ActionSpec(
        action_id, kind, Binding("env", env_id), tenant, body.trajectory_id,
        demand_per_unit=ONE_CORE, key=ResourceKind.CPU, dop_min=dop.min, dop_max=dop.max,
        elasticity=model if dop.max > 1 else NonElastic(), t_ori_s=getattr(body, "t_ori_s", None), timeout_s=timeout_s,
        retryable=body.retryable, memory_bytes=_memory(state, env_id, body.memory), deadline_s=body.deadline_s,
    )  # fmt: skip
    return spec, payload


def _memory(state: ApiState, env_id: str, memory: int | str | None) -> int | None:
    """The declared memory demand; above the env's limit is a ``SpecError`` naming it."""
    if memory is None:
        return None
    mem_bytes = parse_size_bytes(memory, "memory")
    env = state.controller.loop.state.envs.get(env_id)
    if env is not None and mem_bytes > env.spec.mem_bytes:
        raise SpecError("memory", f"must be <= the env's memory limit ({env.spec.mem_bytes} bytes)", memory)
    return mem_bytes


def _elastic(e: Elasticity) -> Elastic:
    table = tuple(e.table) if e.table is not None else None
    serial = e.serial_fraction
    if serial is None and table is None and e.min == e.max:
        serial = 1.0 if e.min == 1 else 0.0  # a fixed DoP: the SDK's reading of cpu=n
    return Elastic(e.min, e.max, serial_fraction=serial, table=table)


def _stdin(body: ExecAction) -> bytes | None:
    if body.stdin is not None and body.stdin_b64 is not None:
        raise SpecError("stdin", "give stdin or stdin_b64, not both", "<both>")
    if body.stdin_b64 is not None:
        try:
            return base64.b64decode(body.stdin_b64, validate=True)
        except (binascii.Error, ValueError):
            raise SpecError("stdin_b64", "must be base64", body.stdin_b64[:32]) from None
    return body.stdin.encode() if body.stdin is not None else None
