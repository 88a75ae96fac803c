"""Test builders for the functional core: clusters, states, actions, and a checked driver.

Everything here goes through the public core API (specs, ``Scheduler.step``) so tests
exercise the same paths the simulator and the runtime use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from arl_tangram.core.action import ActionSpec, Binding, EnvSpec, ServiceSpec
from arl_tangram.core.decisions import Decision, StartAction
from arl_tangram.core.elasticity import Amdahl, ElasticityModel, NonElastic
from arl_tangram.core.events import ActionFinished, EnvReady, EnvRequested, Event, ServiceReady
from arl_tangram.core.invariants import validate
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.resources import MILLICORES_PER_CORE, ZERO, ResourceKind, ResourceVector
from arl_tangram.core.scheduler import Scheduler, StepResult
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import (
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    QuotaPoolSpec,
    split_numa,
)

GIB = 1 << 30
MC = MILLICORES_PER_CORE


def make_cluster(
    cpu_nodes: int = 1,
    cores: int = 8,
    numa: int = 2,
    mem_bytes: int = 64 * GIB,
    gpu_nodes: int = 0,
    gpus_per_node: int = 8,
    quota_pools: Sequence[QuotaPoolSpec] = (),
    services: Mapping[str, ServiceSpec] | None = None,
) -> ClusterSpec:
    numa_cores = split_numa(cores, numa)
    return ClusterSpec(
        cpu_nodes=tuple(CpuNodeSpec(f"cpu-{i}", numa_cores, mem_bytes) for i in range(cpu_nodes)),
        gpu_nodes=tuple(GpuNodeSpec(f"gpu-{i}", gpus_per_node) for i in range(gpu_nodes)),
        quota_pools=tuple(quota_pools),
        services=dict(services or {}),
    )


def make_state(cluster: ClusterSpec | None = None, **cluster_kwargs: Any) -> ClusterState:
    return ClusterState.initial(cluster if cluster is not None else make_cluster(**cluster_kwargs))


def make_service(name: str = "svc", weight_bytes: int = 8 * 10**9, devices_min: int = 1, devices_max: int = 1) -> ServiceSpec:
    return ServiceSpec(name, weight_bytes, devices_min, devices_max)


def make_env(env_id: str = "e0", mem_bytes: int = 1 * GIB, tenant: str = "default") -> EnvSpec:
    return EnvSpec(env_id, mem_bytes, tenant, trajectory_id=env_id)


def make_action(
    action_id: str = "a0",
    *,
    kind: str = "test",
    env: str | None = None,
    service: str | None = None,
    api: str | None = None,
    dop_min: int = 1,
    dop_max: int = 1,
    cores_per_unit: int = 1,
    fixed: ResourceVector = ZERO,
    elasticity: ElasticityModel | None = None,
    t_ori_s: float | None = 1.0,
    tenant: str = "default",
    serial_fraction: float | None = None,
) -> ActionSpec:
    """An action bound to an env (CPU-elastic when dop_max > 1), a GPU service, or an API."""
    if service is not None:
        return ActionSpec(
            action_id, kind, Binding("service", service), tenant, "", ZERO, ResourceVector(gpu_devices=1),
            ResourceKind.GPU, dop_min, dop_max, elasticity or NonElastic(), t_ori_s,
        )
    if api is not None:
        return ActionSpec(
            action_id, kind, Binding("api", api), tenant, "", fixed if not fixed.is_zero() else ResourceVector(quota_tokens=1),
            ZERO, None, 1, 1, elasticity or NonElastic(), t_ori_s,
        )
    binding = Binding("env", env) if env is not None else Binding()
    if elasticity is None:
        elasticity = Amdahl(serial_fraction) if serial_fraction is not None else NonElastic()
    if dop_max > 1 or dop_min > 1:
        return ActionSpec(
            action_id, kind, binding, tenant, "", fixed, ResourceVector(cpu_millicores=cores_per_unit * MC),
            ResourceKind.CPU, dop_min, dop_max, elasticity, t_ori_s,
        )
    fixed_cpu = fixed if not fixed.is_zero() else ResourceVector(cpu_millicores=cores_per_unit * MC)
    return ActionSpec(action_id, kind, binding, tenant, "", fixed_cpu, ZERO, None, 1, 1, elasticity, t_ori_s)


@dataclass
class Driver:
    """Feeds events through ``Scheduler.step`` and checks ``validate`` after every round.

    Keeps the full decision log and the set of actions started/rejected, so tests can ask
    what happened without re-deriving it.
    """

    policy: Policy
    state: ClusterState
    scheduler: Scheduler = field(init=False)
    log: list[Decision] = field(default_factory=list)
    wake_at: float | None = None
    now: float = 0.0

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(self.policy)
        boot = self.scheduler.bootstrap(self.state)
        self.state = boot.state
        self.log.extend(boot.decisions)
        validate(self.state)

    @classmethod
    def of(cls, policy: str | Policy, cluster: ClusterSpec | None = None, **params: Any) -> Driver:
        pol = make_policy(policy, **params) if isinstance(policy, str) else policy
        return cls(pol, make_state(cluster))

    def step(self, events: Iterable[Event] = (), now: float | None = None) -> StepResult:
        if now is not None:
            self.now = max(self.now, now)
        result = self.scheduler.step(self.state, tuple(events), self.now)
        self.state = result.state
        self.wake_at = result.wake_at
        self.log.extend(result.decisions)
        validate(self.state)
        return result

    def ready_everything(self, now: float | None = None) -> StepResult:
        """Report every placed env and every loading replica as ready (instant managers)."""
        events: list[Event] = [EnvReady(e) for e, env in sorted(self.state.envs.items()) if env.node_id and not env.ready]
        events += [ServiceReady(r) for r, rep in sorted(self.state.replicas.items()) if not rep.ready]
        return self.step(events, now)

    def add_ready_env(self, env: EnvSpec) -> None:
        self.step([EnvRequested(env)])
        self.step([EnvReady(env.env_id)])

    def finish(self, *action_ids: str, now: float | None = None) -> StepResult:
        return self.step([ActionFinished(a) for a in action_ids], now)

    def starts(self, decisions: Iterable[Decision] | None = None) -> dict[str, StartAction]:
        return {d.action_id: d for d in (self.log if decisions is None else decisions) if isinstance(d, StartAction)}


def of_type(decisions: Iterable[Decision], kind: type) -> list[Any]:
    return [d for d in decisions if isinstance(d, kind)]
