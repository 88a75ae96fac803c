"""Core: the reference elastic policy (DESIGN.md §5): FCFS candidates, water-filling, greedy eviction.

CPU actions get an elastic DoP per node pool; GPU service actions run under
Evict-on-Execution; API actions pass a global token bucket. Envs hold memory only.
"""

from __future__ import annotations

from arl_tangram.core.decisions import Decision
from arl_tangram.core.policies import cpu_round, placement, quota, services
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.state import QueuedAction, StateEditor


class ElasticPolicy(Policy):
    """``depth`` bounds candidates per round and the queued actions an estimate charges;
    ``deferral_tries`` bounds the greedy eviction per pool (8 measured as good as 32 on the
    coding and dense-ablation workloads, at a quarter of the cost); ``aging_s`` bounds
    backfill overtaking; ``host_to_device_gbps`` prices a swap-in against waiting."""

    name = "elastic"

    def __init__(
        self,
        depth: int = 32,
        aging_s: float = 10.0,
        host_to_device_gbps: float = 25.0,
        scan_limit: int = 1024,
        deferral_tries: int = 8,
    ) -> None:
        self.depth = depth
        self.deferral_tries = deferral_tries
        self.aging_s = aging_s
        self.host_to_device_gbps = host_to_device_gbps
        self.scan_limit = scan_limit
        self._wake: float | None = None

    def dop_floor(self, qa: QueuedAction) -> int:
        return qa.spec.dop_min

    def fixed_dop(self) -> int | None:
        return None

    def schedule(self, ed: StateEditor, cause: str) -> list[Decision]:
        decisions = placement.place_spread(ed, cause)
        pools = cpu_round.collect(ed, self.depth, self.aging_s, self.dop_floor, self.scan_limit)
        fixed = self.fixed_dop()
        decisions += cpu_round.start_pools(ed, pools, cause, self.depth, fixed, evict=fixed is None, aging_s=self.aging_s, tries=self.deferral_tries)
        decisions += services.schedule_pooled(ed, cause, self.depth, self.host_to_device_gbps)
        quota_decisions, quota_wake = quota.schedule_managed(ed, cause)
        decisions += quota_decisions
        aging_wake = None
        if pools.oldest_blocked_s is not None and pools.oldest_blocked_s + self.aging_s > ed.now_s:
            aging_wake = pools.oldest_blocked_s + self.aging_s
        wakes = [w for w in (quota_wake, aging_wake) if w is not None]
        self._wake = min(wakes) if wakes else None
        return decisions

    def wake_at(self, ed: StateEditor) -> float | None:
        return self._wake


class FixedDopPolicy(ElasticPolicy):
    """Ablation: action-level sharing, but every elastic action gets exactly ``dop`` units
    (clamped to its bounds), FCFS with backfill, no eviction."""

    name = "fixed-dop"

    def __init__(self, dop: int = 4, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.dop = dop
        self._dop = dop

    def schedule(self, ed: StateEditor, cause: str) -> list[Decision]:
        # A DoP wider than a node could never start: cap it at the smallest node's cores.
        smallest = min((sum(n.numa_cores) for n in ed.spec.cpu_nodes), default=self.dop)
        self._dop = max(1, min(self.dop, smallest))
        return super().schedule(ed, cause)

    def dop_floor(self, qa: QueuedAction) -> int:
        return min(max(self._dop, qa.spec.dop_min), qa.spec.dop_max)

    def fixed_dop(self) -> int | None:
        return self._dop


class IdealPolicy(FixedDopPolicy):
    """Lower bound: every action at its ``dop_max`` at once, restores free. Run it on a cluster
    too large to ever fill (the simulator builds one) so nothing queues."""

    name = "ideal"

    def __init__(self, **kwargs: float) -> None:
        kwargs.setdefault("host_to_device_gbps", float("inf"))
        super().__init__(dop=1 << 30, **kwargs)
