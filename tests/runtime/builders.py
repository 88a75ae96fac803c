"""Builders of the runtime tests: action specs and payloads as the SDK makes them, and an
embedded runtime with service settings, without going through the SDK."""

from __future__ import annotations

import itertools

from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import ExecPayload, NoopPayload
from arl_tangram.runtime.config import ServiceSettings, TangramConfig, TenantConfig

_ids = itertools.count()
ONE_CORE = ResourceVector(cpu_millicores=1000)


def next_id(prefix: str = "a") -> str:
    return f"{prefix}-{next(_ids)}"


def exec_spec(env_id: str, *, cores: int = 1, tenant: str = "default", action_id: str | None = None) -> ActionSpec:
    """An exec on ``env_id`` holding exactly ``cores`` cores while it runs."""
    return ActionSpec(
        action_id or next_id("exec"), "exec", Binding("env", env_id), tenant,
        demand_per_unit=ONE_CORE, key=ResourceKind.CPU, dop_min=cores, dop_max=cores,
    )  # fmt: skip


def exec_payload(command: str, timeout_s: float = 60.0) -> ExecPayload:
    return ExecPayload(command, timeout_s=timeout_s)


def noop_spec(*, tenant: str = "default", cpu_millicores: int = 0, action_id: str | None = None) -> ActionSpec:
    """A no-resource action, or one that must wait for ``cpu_millicores`` on the node (it
    queues behind actions holding every core) though it runs nothing."""
    return ActionSpec(
        action_id or next_id("noop"), "noop", tenant=tenant, demand_fixed=ResourceVector(cpu_millicores=cpu_millicores)
    )  # fmt: skip


NOOP = NoopPayload()


def config(*, tenants: dict[str, TenantConfig] | None = None, **service: object) -> TangramConfig:
    return TangramConfig(service=ServiceSettings(**service), tenants=tenants or {})  # type: ignore[arg-type]
