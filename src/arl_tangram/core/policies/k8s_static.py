"""Core: baselines that hold resources statically: a pod per trajectory, a pool per task.

``k8s-static``: each env is a pod with fixed cores held for its whole life (Pending while
no node has room); its actions run at once on the pod's cores. GPU services are static
dedicated deployments; API calls are unmanaged client calls.
``task-pool``: each tenant (RL task) owns a fixed slice of the CPU nodes; actions share
that slice at a fixed DoP, never borrowing another task's idle nodes; GPU and API as above.
"""

from __future__ import annotations

from collections.abc import Mapping

from arl_tangram.core import images, ledger, memory
from arl_tangram.core.decisions import Decision
from arl_tangram.core.policies import cpu_round, placement, quota, services
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.resources import MILLICORES_PER_CORE, ZERO, ResourceKind, ResourceVector
from arl_tangram.core.state import StateEditor


class K8sStaticPolicy(Policy):
    name = "k8s-static"

    def __init__(self, pod_millicores: int = 3000, deployments: Mapping[str, tuple[int, int]] | None = None, depth: int = 1024) -> None:
        self.pod_millicores = pod_millicores
        self.deployments = dict(deployments or {})
        self.depth = depth

    def bootstrap(self, ed: StateEditor) -> list[Decision]:
        return services.bootstrap_static(ed, self.deployments)

    def schedule(self, ed: StateEditor, cause: str) -> list[Decision]:
        decisions = memory.serve_paused(ed, cause)  # a pod holds its limit: a pause there ends oom_killed
        decisions += placement.place_spread(ed, cause, cores_held=self.pod_millicores)
        pod_cores = max(1, self.pod_millicores // MILLICORES_PER_CORE)
        for qa in list(ed.queue_cpu.values()):
            spec = qa.spec
            if spec.binding.kind != "env":
                continue
            env = ed.envs.get(spec.binding.name)
            if env is None or not env.ready or spec.binding.name in ed.env_busy:
                continue
            dop = min(max(pod_cores, spec.dop_min), spec.dop_max) if spec.key is ResourceKind.CPU else spec.dop_min
            assert env.node_id is not None
            decisions.append(ledger.start_action(ed, qa, env.node_id, dop, "pod: runs on its own cores", cause, grant=ZERO))
        decisions += services.schedule_static(ed, cause, self.depth)
        decisions += quota.schedule_unmanaged(ed, cause)
        return decisions


class TaskPoolPolicy(Policy):
    name = "task-pool"

    def __init__(
        self,
        partitions: Mapping[str, tuple[str, ...]] | None = None,
        deployments: Mapping[str, tuple[int, int]] | None = None,
        dop: int = 1,
        depth: int = 64,
    ) -> None:
        self.partitions = {t: tuple(nodes) for t, nodes in (partitions or {}).items()}
        self.deployments = dict(deployments or {})
        self.dop = dop
        self.depth = depth

    def bootstrap(self, ed: StateEditor) -> list[Decision]:
        return services.bootstrap_static(ed, self.deployments)

    def _place(self, ed: StateEditor, cause: str) -> list[Decision]:
        decisions: list[Decision] = []
        blocked: set[str] = set()  # FCFS within a task: one task's full pool never blocks another's
        for env_id in placement.pending_envs(ed):
            env = ed.envs[env_id]
            if env.spec.tenant in blocked:
                continue
            allowed = self.partitions.get(env.spec.tenant) or tuple(sorted(ed.cpu))
            fits = [n for n in allowed if n in ed.cpu and ed.cpu[n].free_mem_bytes >= env.spec.mem_bytes]
            if not fits:
                blocked.add(env.spec.tenant)
                continue
            node = max(fits, key=lambda n: (ed.cpu[n].free_mem_bytes, n))
            held = ResourceVector(mem_bytes=env.spec.mem_bytes)
            decisions += images.assign_env(ed, env_id, node, held, f"task pool of {env.spec.tenant}", cause)
        return decisions

    def schedule(self, ed: StateEditor, cause: str) -> list[Decision]:
        decisions = memory.serve_paused(ed, cause)
        decisions += self._place(ed, cause)
        dop = self.dop
        pools = cpu_round.collect(ed, self.depth, float("inf"), lambda qa: min(max(dop, qa.spec.dop_min), qa.spec.dop_max))
        decisions += cpu_round.start_pools(ed, pools, cause, self.depth, dop, evict=False)
        decisions += services.schedule_static(ed, cause, self.depth)
        decisions += quota.schedule_unmanaged(ed, cause)
        return decisions
