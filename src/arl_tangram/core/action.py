"""Core: the unified action formulation (ActionSpec) and the spec of services (``EnvSpec``,
what an env is, lives in ``core.env_spec`` and is re-exported here).

An action is one atomic external operation. Its demand is ``demand_fixed + m *
demand_per_unit`` where ``m`` (its DoP) lies in ``[dop_min, dop_max]`` and counts units of
the ``key`` elastic resource. Every constructor validates and raises ``SpecError`` naming
the field and the rule; a spec that exists is well-formed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal

from arl_tangram.core.elasticity import ElasticityModel, NonElastic
from arl_tangram.core.env_spec import EnvSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import FIELD_OF_KIND, ZERO, ResourceKind, ResourceVector

BindingKind = Literal["env", "service", "api", "none"]
GPU_CHUNK_SIZES = (1, 2, 4, 8)
__all__ = ["ActionSpec", "Binding", "EnvSpec", "ServiceSpec"]


@dataclass(frozen=True, slots=True)
class Binding:
    """What an action runs against: an env (sandbox), a GPU service, an API provider, or nothing."""

    kind: BindingKind = "none"
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("env", "service", "api", "none"):
            raise SpecError("binding.kind", "must be one of env, service, api, none", self.kind)
        if self.kind != "none" and not self.name:
            raise SpecError("binding.name", f"must be non-empty for a {self.kind} binding", self.name)


def _check_vector(name: str, vector: ResourceVector) -> None:
    if not isinstance(vector, ResourceVector):
        raise SpecError(name, "must be a ResourceVector", vector)
    for kind in ResourceKind:
        amount = getattr(vector, FIELD_OF_KIND[kind])  # raw: amount() would coerce to int
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise SpecError(f"{name}.{kind.value}", "must be an integer amount", amount)
        if amount < 0:
            raise SpecError(f"{name}.{kind.value}", "must be >= 0", amount)


def _check_positive_finite(name: str, value: float | None) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(name, "must be a finite number > 0", value)


@dataclass(frozen=True)
class ActionSpec:
    """One action as submitted. ``t_ori_s`` is the duration on one unit (None: learn it per kind).

    ``retryable``: the client says running it twice is harmless. When the node running it is
    lost, the core queues it again (elsewhere) instead of ending it ``error`` / ``node_lost``,
    unless its env went with the node (bounded: ``scheduler.MAX_ATTEMPTS``).

    ``deadline_s``: seconds after submission by which the caller needs the result (None: no
    deadline). An action that can no longer start in time (``core.preemption``) ends
    ``rejected`` with a reason starting ``deadline:``, a retryable outcome, instead of
    running into the caller's own timeout.
    """

    action_id: str
    kind: str
    binding: Binding = Binding()
    tenant: str = "default"
    trajectory_id: str = ""
    demand_fixed: ResourceVector = ZERO
    demand_per_unit: ResourceVector = ZERO
    key: ResourceKind | None = None
    dop_min: int = 1
    dop_max: int = 1
    elasticity: ElasticityModel = field(default_factory=NonElastic)
    t_ori_s: float | None = None
    timeout_s: float | None = None
    retryable: bool = False
    deadline_s: float | None = None
    #: declared memory demand of one run (bytes above its env's idle footprint); None: the
    #: core learns it per kind, else charges the env's whole limit (``core.memory``)
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.action_id:
            raise SpecError("action_id", "must be non-empty", self.action_id)
        if not self.kind:
            raise SpecError("kind", "must be non-empty", self.kind)
        if not isinstance(self.binding, Binding):
            raise SpecError("binding", "must be a Binding", self.binding)
        _check_vector("demand_fixed", self.demand_fixed)
        _check_vector("demand_per_unit", self.demand_per_unit)
        for name in ("dop_min", "dop_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(name, "must be an integer >= 1", value)
        if self.dop_min > self.dop_max:
            raise SpecError("dop_min", "must be <= dop_max", (self.dop_min, self.dop_max))
        if self.key is not None and not isinstance(self.key, ResourceKind):
            raise SpecError("key", "must be a ResourceKind or None", self.key)
        if self.key is None and self.dop_max != 1:
            raise SpecError("dop_max", "must be 1 when the action has no key elastic resource", self.dop_max)
        if self.key is not None and self.demand_per_unit.amount(self.key) <= 0:
            raise SpecError(f"demand_per_unit.{self.key.value}", "must be > 0 for the key resource", 0)
        if self.key is ResourceKind.GPU:
            for name in ("dop_min", "dop_max"):
                if getattr(self, name) not in GPU_CHUNK_SIZES:
                    raise SpecError(name, "must be a GPU chunk size in {1, 2, 4, 8}", getattr(self, name))
        if not isinstance(self.elasticity, ElasticityModel):
            raise SpecError("elasticity", "must be an ElasticityModel", self.elasticity)
        _check_positive_finite("t_ori_s", self.t_ori_s)
        _check_positive_finite("timeout_s", self.timeout_s)
        _check_positive_finite("deadline_s", self.deadline_s)
        if not isinstance(self.retryable, bool):
            raise SpecError("retryable", "must be a boolean", self.retryable)
        if self.memory_bytes is not None and (
            not isinstance(self.memory_bytes, int) or isinstance(self.memory_bytes, bool) or self.memory_bytes < 1
        ):
            raise SpecError("memory", "must be an integer number of bytes >= 1", self.memory_bytes)

    def demand_at(self, dop: int) -> ResourceVector:
        """Total demand when running at ``dop`` units of the key resource."""
        if dop == self.dop_min:
            return self.demand_min
        by_dop = self._demand_by_dop
        demand = by_dop.get(dop)
        if demand is None:  # a fixed-DoP policy asks for the same DoP on every round
            demand = by_dop[dop] = self.demand_fixed + self.demand_per_unit.scale(dop)
        return demand

    @functools.cached_property
    def _demand_by_dop(self) -> dict[int, ResourceVector]:
        """Demands at other DoPs already computed (vectors are immutable, so shared)."""
        return {}

    @functools.cached_property
    def demand_min(self) -> ResourceVector:
        """Demand at ``dop_min``, asked for on every scheduling round: computed once."""
        return self.demand_fixed + self.demand_per_unit.scale(self.dop_min)

    def duration_s(self, t_ori_s: float, dop: int) -> float:
        return self.elasticity.duration_s(t_ori_s, dop)


@dataclass(frozen=True)
class ServiceSpec:
    """A GPU service (reward, judge or teacher model): weights size and devices per replica.

    A generating service (an LLM judge, a GenRM) also holds a KV cache that grows with its
    batch: ``kv_cache_bytes`` is one replica's reservation for it, sized by the manager from
    its config (max batch x max context x KV bytes per token); it sits on the replica's first
    device beside that device's share of the weights and is never copied on a swap-in.
    """

    name: str
    weight_bytes: int
    devices_min: int = 1
    devices_max: int = 1
    tenant: str = "default"
    kv_cache_bytes: int = 0
    max_batch: int = 1  # actions one replica runs at once (a generating service's batch)

    def device_bytes(self, size: int) -> int:
        """Bytes the most loaded device of a ``size``-device replica holds (weights split
        evenly, the KV cache on the first device)."""
        return -(-self.weight_bytes // size) + self.kv_cache_bytes

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("name", "must be non-empty", self.name)
        if not isinstance(self.weight_bytes, int) or self.weight_bytes <= 0:
            raise SpecError("weight_bytes", "must be an integer > 0", self.weight_bytes)
        if not isinstance(self.kv_cache_bytes, int) or self.kv_cache_bytes < 0:
            raise SpecError("kv_cache_bytes", "must be an integer >= 0", self.kv_cache_bytes)
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise SpecError("max_batch", "must be an integer >= 1", self.max_batch)
        for name in ("devices_min", "devices_max"):
            if getattr(self, name) not in GPU_CHUNK_SIZES:
                raise SpecError(name, "must be a GPU chunk size in {1, 2, 4, 8}", getattr(self, name))
        if self.devices_min > self.devices_max:
            raise SpecError("devices_min", "must be <= devices_max", (self.devices_min, self.devices_max))
