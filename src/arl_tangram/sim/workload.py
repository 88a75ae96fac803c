"""Sim: what a workload is: trajectories of (think, action) phases, plus the services and
API pools they need. Workload generators (``workloads/``) build these from a seed."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from arl_tangram.core.action import ServiceSpec
from arl_tangram.core.elasticity import ElasticityModel, NonElastic
from arl_tangram.core.resources import ZERO, ResourceKind, ResourceVector
from arl_tangram.core.topology import QuotaPoolSpec


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """A lognormal draw with the given *mean* (not median) and log-space spread ``sigma``."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


@dataclass(frozen=True)
class ActionTemplate:
    """One action of a trajectory. ``t_ori_s`` is its true duration on one unit and
    ``elasticity`` its true curve (what the simulated managers execute); ``declared`` is
    the curve its client states (what the policy sees), None when the client states the
    true one. ``memory_bytes``: the memory demand its client declares (``ActionSpec.
    memory_bytes``; granted while it runs under per-action memory), None: none declared."""

    kind: str
    binding_kind: str  # env | service | api
    t_ori_s: float
    binding_name: str = ""  # service or provider; env actions bind to their trajectory's env
    key: ResourceKind | None = None
    dop_min: int = 1
    dop_max: int = 1
    per_unit: ResourceVector = ZERO
    fixed: ResourceVector = ZERO
    elasticity: ElasticityModel = field(default_factory=NonElastic)
    category: str = "env"  # env | reward | api | teacher: how the report groups ACT
    declared: ElasticityModel | None = None
    memory_bytes: int | None = None

    @property
    def declared_elasticity(self) -> ElasticityModel:
        """The curve the action's spec carries: the declared one, else the true one."""
        return self.elasticity if self.declared is None else self.declared


@dataclass(frozen=True)
class TrajectoryPlan:
    trajectory_id: str
    tenant: str
    env_mem_bytes: int | None  # None: the trajectory needs no sandbox
    phases: tuple[tuple[float, ActionTemplate], ...]  # (think time before it, the action)
    start_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    name: str
    trajectories: tuple[TrajectoryPlan, ...]
    services: Mapping[str, ServiceSpec] = field(default_factory=dict)
    quota_pools: tuple[QuotaPoolSpec, ...] = ()
    parameters: Mapping[str, object] = field(default_factory=dict)  # printed in the report
