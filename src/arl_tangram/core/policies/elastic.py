"""Core: the reference elastic policy (DESIGN.md §5): short-first candidates, water-filling, greedy eviction.

CPU actions get an elastic DoP per node pool; GPU service actions run under
Evict-on-Execution; API actions pass a global token bucket. Envs hold memory only.
"""

from __future__ import annotations

from arl_tangram.core import memory, preemption
from arl_tangram.core.decisions import Decision
from arl_tangram.core.errors import SpecError
from arl_tangram.core.policies import cpu_round, opportunity, placement, quota, services
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.state import QueuedAction, StateEditor

#: headroom never granted on a node under per-action memory: it absorbs what the accounting
#: sees late (footprints grow between reports, page cache, the node's own processes) so the
#: kernel never OOM-kills at node level. Assumption (no PAPER.md figure): 256 MiB, ~1 % of
#: this 24 GiB host and ~200 of the ~1.2 MB idle sandboxes issue 21 measures.
DEFAULT_MEM_RESERVE_BYTES = 256 << 20
#: the CPU queue's order (``short_first``): an action is due at its arrival plus this many
#: times its expected size. Assumption (no PAPER.md figure): 30, measured on the live SWE
#: workload's fitted simulation (mean ACT 0.93 s FCFS, 0.71 at 10, 0.65 at 30, 0.645 at 100)
#: and neutral on the coding sweep; past ``aging_s`` every action is due at its arrival.
DEFAULT_SHORT_FIRST_SLOWDOWN = 30.0


class ElasticPolicy(Policy):
    """``depth`` bounds candidates per round and the queued actions an estimate charges;
    ``deferral_tries`` bounds the greedy eviction per pool (8 measured as good as 32 on the
    coding and dense-ablation workloads, at a quarter of the cost); ``aging_s`` bounds
    backfill overtaking; ``host_to_device_gbps`` prices a swap-in against waiting;
    ``opportunity_cost`` caps a grant at the widest DoP the node can sustain for the
    arrivals it expects during the run, floored at the curve's efficiency knee
    (``opportunity.fair_caps``; off: the reference policy, spare cores priced at zero).
    ``preempt_quantum_s``: the cap of a single-core CPU action's first quantum (twice its
    kind's T_ori, ``preemption.quantum_of``); one that has run its quantum while work waits
    on its node is demoted and its cores re-granted (``core.preemption``); None: off.
    Deadlines (``ActionSpec.deadline_s``) are enforced either way.

    ``memory_per_action``: envs hold their idle footprint and actions their memory grants
    (``core.memory``; off: each env holds its limit for its life, as before issue 21);
    ``mem_reserve_bytes`` of each node's memory are never granted (headroom; None:
    ``DEFAULT_MEM_RESERVE_BYTES`` under per-action memory, 0 when envs hold their limits,
    which are hard caps already). ``memory_pause``: an action over its grant pauses while
    the core decides (pause-and-grow); off: it is OOM-killed at its grant, as a pod is at its
    limit. The live executor reads it (``EmbeddedRuntime``); the round is the same either way.

    ``short_first_slowdown``: the CPU queue is walked by due time, an action's arrival plus
    this many times its expected size (``short_first``), so short actions pass long ones
    that arrived with them; 0: FCFS.

    ``cpu_packing``: a single-core env action is charged on its node by its kind's measured
    CPU use, its limit staying its whole demand, so short runs that leave their core idle
    share it (``core.packing``); off: every grant is exclusive.

    Holds configuration only (no per-round state), so one instance may serve several loops.
    """

    name = "elastic"

    def __init__(
        self,
        depth: int = 32,
        aging_s: float = 10.0,
        host_to_device_gbps: float = 25.0,
        scan_limit: int = 1024,
        deferral_tries: int = 8,
        opportunity_cost: bool = True,
        preempt_quantum_s: float | None = None,
        memory_per_action: bool = True,
        mem_reserve_bytes: int | None = None,
        memory_pause: bool = True,
        short_first_slowdown: float = DEFAULT_SHORT_FIRST_SLOWDOWN,
        cpu_packing: bool = True,
    ) -> None:
        if not isinstance(cpu_packing, bool):
            raise SpecError("cpu_packing", "must be true or false", cpu_packing)
        self.cpu_packing = cpu_packing
        if preempt_quantum_s is not None and not preempt_quantum_s > 0:
            raise SpecError("preempt_quantum_s", "must be > 0 seconds, or None (no preemption)", preempt_quantum_s)
        self.preempt_quantum_s = preempt_quantum_s
        bad_slowdown = isinstance(short_first_slowdown, bool) or not isinstance(short_first_slowdown, (int, float))
        if bad_slowdown or not 0 <= short_first_slowdown < float("inf"):
            raise SpecError("short_first_slowdown", "must be a finite number >= 0 (0: FCFS)", short_first_slowdown)
        self.short_first_slowdown = float(short_first_slowdown)
        self.depth = depth
        self.memory_per_action = memory_per_action
        bad_reserve = isinstance(mem_reserve_bytes, bool) or not isinstance(mem_reserve_bytes, int) or mem_reserve_bytes < 0
        if mem_reserve_bytes is not None and bad_reserve:
            raise SpecError("mem_reserve_bytes", "must be an integer >= 0 (bytes), or None (the default)", mem_reserve_bytes)
        if not isinstance(memory_pause, bool):
            raise SpecError("memory_pause", "must be true or false", memory_pause)
        default_reserve = DEFAULT_MEM_RESERVE_BYTES if memory_per_action else 0
        self.mem_reserve_bytes = default_reserve if mem_reserve_bytes is None else mem_reserve_bytes
        self.memory_pause = memory_pause
        self.opportunity_cost = opportunity_cost
        self.deferral_tries = deferral_tries
        self.aging_s = aging_s
        self.host_to_device_gbps = host_to_device_gbps
        self.scan_limit = scan_limit

    def fixed_dop(self, ed: StateEditor) -> int | None:
        """The DoP every elastic action gets, or None for elastic allocation."""
        return None

    def schedule(self, ed: StateEditor, cause: str) -> list[Decision]:
        reserve = self.mem_reserve_bytes
        decisions = memory.serve_paused(ed, cause, reserve)  # paused actions come before new work
        decisions += placement.place_spread(ed, cause, per_action_memory=self.memory_per_action, mem_reserve_bytes=reserve)
        decisions += preemption.reject_late(ed, cause)
        if self.preempt_quantum_s is not None:
            decisions += preemption.preempt_overdue(ed, cause, self.preempt_quantum_s)
        fixed = self.fixed_dop(ed)

        def dop_floor(qa: QueuedAction) -> int:
            spec = qa.spec
            return spec.dop_min if fixed is None else min(max(fixed, spec.dop_min), spec.dop_max)

        pack = self.cpu_packing
        pools = cpu_round.collect(ed, self.depth, self.aging_s, dop_floor, self.scan_limit, reserve, self.short_first_slowdown, pack)
        caps = None
        if fixed is None and self.opportunity_cost:
            caps = opportunity.fair_caps(ed, pools.candidates, pools.backlog)
        decisions += cpu_round.start_pools(
            ed, pools, cause, self.depth, fixed, evict=fixed is None, aging_s=self.aging_s, tries=self.deferral_tries, caps=caps,
            pack=pack,
        )
        decisions += services.schedule_pooled(ed, cause, self.depth, self.host_to_device_gbps)
        decisions += quota.schedule_managed(ed, cause)[0]
        return decisions

    def wake_at(self, ed: StateEditor) -> float | None:
        """Derived from the round's final state: when the next quota token arrives for a
        waiting API action, or when the oldest queued CPU action reaches the aging bound
        (it then reserves its node). Nothing is carried between calls."""
        quantum = None if self.preempt_quantum_s is None else preemption.next_quantum_s(ed, self.preempt_quantum_s)
        ahead = (quota.next_token_s(ed), self._aging_wake(ed), preemption.next_deadline_s(ed), quantum)
        wakes = [w for w in ahead if w is not None]
        return min(wakes) if wakes else None

    def _aging_wake(self, ed: StateEditor) -> float | None:
        for qa in ed.queue_cpu.values():  # FCFS: the first is the oldest still waiting
            at = qa.submitted_s + self.aging_s
            return at if at > ed.now_s else None
        return None


class FixedDopPolicy(ElasticPolicy):
    """Ablation: action-level sharing, but every elastic action gets exactly ``dop`` units
    (clamped to its bounds), the same queue order as elastic (short-first), backfill, no eviction."""

    name = "fixed-dop"

    def __init__(self, dop: int = 4, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.dop = dop

    def fixed_dop(self, ed: StateEditor) -> int | None:
        # A DoP wider than a node could never start: cap it at the smallest node's cores.
        smallest = min((sum(n.numa_cores) for n in ed.spec.cpu_nodes), default=self.dop)
        return max(1, min(self.dop, smallest))


class IdealPolicy(FixedDopPolicy):
    """Lower bound: every action at its ``dop_max`` at once, restores free. Run it on a cluster
    too large to ever fill (the simulator builds one) so nothing queues."""

    name = "ideal"

    def __init__(self, **kwargs: float) -> None:
        kwargs.setdefault("host_to_device_gbps", float("inf"))
        super().__init__(dop=1 << 30, **kwargs)
