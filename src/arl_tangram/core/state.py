"""Core: cluster state as frozen records, and the copy-on-write editor the scheduler uses.

``ClusterState`` is never mutated. ``Scheduler.step`` opens a ``StateEditor`` on it, which
copies a table only when the round first writes to it, and ``freeze()`` returns the new
state. All accounting (free capacity, queue, running set, envs, replicas, quota) changes
only through the editor's methods, so every policy shares one bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from arl_tangram.core.action import ActionSpec, EnvSpec
from arl_tangram.core.chunks import chunk_mask
from arl_tangram.core.env_spec import LayerNeed
from arl_tangram.core.resources import MILLICORES_PER_CORE, ZERO, ResourceVector
from arl_tangram.core.topology import ClusterSpec, CpuNodeSpec, GpuNodeSpec


@dataclass(frozen=True, slots=True)
class QueuedAction:
    spec: ActionSpec
    submitted_s: float
    seq: int  # FCFS order; ties in time break by sequence number
    attempt: int = 1  # 2, 3, ...: queued again after its node was lost (a retryable action)


@dataclass(frozen=True, slots=True)
class Running:
    spec: ActionSpec
    node_id: str
    grant: ResourceVector
    dop: int
    submitted_s: float
    started_s: float
    expected_end_s: float
    replica_id: str | None = None
    numa_millicores: tuple[int, ...] = ()
    seq: int = 0  # its place in the queue, kept for a retry (it goes back where it was)
    attempt: int = 1  # only this attempt's ``ActionFinished`` ends it
    # Pause bookkeeping (core.preemption; memory pauses too): when the current pause began
    # (None: not paused), the sum of finished pauses, and why ("preempted" | "memory").
    # A preempted action has given its cores back (``grant`` then holds its memory only).
    paused_since_s: float | None = None
    paused_s: float = 0.0
    pause_cause: str = ""


@dataclass(frozen=True, slots=True)
class EnvState:
    spec: EnvSpec
    requested_s: float
    seq: int
    node_id: str | None = None  # None while pending placement
    held: ResourceVector = ZERO
    held_numa: tuple[int, ...] = ()  # millicores of ``held`` per NUMA domain, returned on release
    ready: bool = False
    # Memory per action (``core.memory``): ``held`` is the env's idle footprint, not its
    # limit; its actions' grants come on top. False: ``held`` is the limit (a pod).
    per_action_memory: bool = False


@dataclass(frozen=True, slots=True)
class Replica:
    replica_id: str
    service: str
    node_id: str
    offset: int
    size: int
    ready: bool = False
    # Actions running on it, in start order: at most one, or up to its service's
    # ``max_batch`` for a generating service (they decode together in one batch).
    busy_actions: tuple[str, ...] = ()
    last_used_s: float = 0.0
    pinned: bool = False  # static deployments are never evicted

    @property
    def busy_action(self) -> str | None:
        """The first action running on it (None: idle, so it may be evicted)."""
        return self.busy_actions[0] if self.busy_actions else None


@dataclass(frozen=True, slots=True)
class PullState:
    """A pull of ``image`` onto ``node_id`` (``core.images``): queued while
    ``expected_end_s`` is None, running after its ``PullImage``. ``layers``: the missing
    layers it claims (no other pull on the node brings them; empty when the image's layers
    were unknown when it was asked for)."""

    pull_id: str
    node_id: str
    image: str
    layers: tuple[LayerNeed, ...]
    seq: int
    requested_s: float
    expected_end_s: float | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TenantUse:
    """A tenant's use of one lane: ``held_units`` now, and ``avg_units``, the moving average
    of what it held, as of ``since_s`` (it decays towards ``held_units`` after that)."""

    held_units: int
    avg_units: float
    since_s: float


@dataclass(frozen=True, slots=True)
class CpuFree:
    free_millicores: int
    free_mem_bytes: int
    numa_free: tuple[int, ...]  # millicores per NUMA domain


@dataclass(frozen=True, slots=True)
class QuotaFree:
    free_tokens: int
    bucket: float  # request tokens available now (refilled at the provider's rate)
    refilled_s: float


_TABLES = (
    "cpu", "gpu", "quota", "envs", "env_queue", "env_busy", "replicas",
    "queue_cpu", "queue_service", "queue_api", "running", "estimates", "service_demand",
    "tenant_queued", "tenant_held", "env_flow",
    "node_layers", "image_layers", "pulls", "env_pulls", "pull_rate",
    "env_footprint", "mem_peaks", "mem_waits", "mem_shortfall", "cpu_use",
)


def lane_of(binding_kind: str) -> str:
    """The queue table an action waits in: one FCFS lane per kind of binding, so each
    policy step walks only the actions it can place."""
    return {"service": "queue_service", "api": "queue_api"}.get(binding_kind, "queue_cpu")


@dataclass(frozen=True)
class ClusterState:
    spec: ClusterSpec
    now_s: float = 0.0
    seq: int = 0
    cpu: Mapping[str, CpuFree] = field(default_factory=dict)
    gpu: Mapping[str, int] = field(default_factory=dict)  # node -> used device mask
    quota: Mapping[str, QuotaFree] = field(default_factory=dict)
    envs: Mapping[str, EnvState] = field(default_factory=dict)
    env_queue: Mapping[str, int] = field(default_factory=dict)  # envs awaiting placement -> seq (FCFS)
    # env -> its running actions. Kept apart from ``envs`` so that starting and finishing
    # actions copies a table as large as the running set, not one as large as every env.
    env_busy: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    replicas: Mapping[str, Replica] = field(default_factory=dict)
    queue_cpu: Mapping[str, QueuedAction] = field(default_factory=dict)  # env / unbound; insertion order = FCFS
    queue_service: Mapping[str, QueuedAction] = field(default_factory=dict)  # GPU service actions
    queue_api: Mapping[str, QueuedAction] = field(default_factory=dict)  # API quota actions
    running: Mapping[str, Running] = field(default_factory=dict)
    estimates: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # kind -> (n, mean T_ori)
    # service -> (exponentially decayed count of its requests, when it was last decayed)
    service_demand: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # Fair-share bookkeeping per (lane, tenant) (core/fair_share.py): how many actions it has
    # queued in the lane, and what its running actions of the lane hold and held recently.
    tenant_queued: Mapping[tuple[str, str], int] = field(default_factory=dict)
    tenant_held: Mapping[tuple[str, str], TenantUse] = field(default_factory=dict)
    # What env submissions taught about the pool's arrivals (core/env_flow.py): decayed sums.
    env_flow: Mapping[str, float] = field(default_factory=dict)
    # Image locality (core/images.py): the layers each node holds (digest -> unpacked bytes),
    # the layers of each image reference seen, pulls queued or running, the pulls each
    # assigned env waits on before its sandbox can start, and each node's measured
    # pull+unpack bandwidth (bytes/s).
    node_layers: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    image_layers: Mapping[str, tuple[LayerNeed, ...]] = field(default_factory=dict)
    pulls: Mapping[str, PullState] = field(default_factory=dict)
    env_pulls: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pull_rate: Mapping[str, float] = field(default_factory=dict)
    # Memory per action (core/memory.py): each env's measured idle footprint (smoothed,
    # bytes), the recent peaks of each action kind (bytes, newest last), and the paused
    # actions waiting for memory -> the grant (bytes) they wait for.
    env_footprint: Mapping[str, int] = field(default_factory=dict)
    mem_peaks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    mem_waits: Mapping[str, int] = field(default_factory=dict)
    # Memory pressure (core/mem_pressure.py): node -> bytes of the ledger's free memory that
    # the node's last report says are not really free (absent: none).
    mem_shortfall: Mapping[str, int] = field(default_factory=dict)
    # CPU packing (core/packing.py): kind -> (runs measured, smoothed CPU use of its grant).
    cpu_use: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    # How many actions in ``queue_cpu`` carry a deadline (core/ledger.py keeps it): when
    # none does, a round skips the deadline passes over the queue (core/preemption.py).
    queued_deadlines: int = 0

    def queued(self) -> dict[str, QueuedAction]:
        """Every queued action, all lanes, in FCFS (sequence) order."""
        merged = [*self.queue_cpu.values(), *self.queue_service.values(), *self.queue_api.values()]
        return {qa.spec.action_id: qa for qa in sorted(merged, key=lambda qa: qa.seq)}

    @classmethod
    def initial(cls, spec: ClusterSpec) -> ClusterState:
        cpu = {
            n.node_id: CpuFree(n.millicores, n.mem_bytes, tuple(c * MILLICORES_PER_CORE for c in n.numa_cores))
            for n in spec.cpu_nodes
        }
        gpu = {n.node_id: 0 for n in spec.gpu_nodes}
        quota = {p.provider: QuotaFree(p.max_concurrency, float(p.max_concurrency), 0.0) for p in spec.quota_pools}
        return cls(spec=spec, cpu=cpu, gpu=gpu, quota=quota)

    def edit(self, now_s: float) -> StateEditor:
        return StateEditor(self, now_s)


class StateEditor:
    """Copy-on-write view of a ``ClusterState`` for one scheduling round (not thread-safe)."""

    # Tables are plain instance attributes (fast reads on the hot path); ``w`` swaps in a copy.
    cpu: Mapping[str, CpuFree]
    gpu: Mapping[str, int]
    quota: Mapping[str, QuotaFree]
    envs: Mapping[str, EnvState]
    env_queue: Mapping[str, int]
    env_busy: Mapping[str, tuple[str, ...]]
    replicas: Mapping[str, Replica]
    queue_cpu: Mapping[str, QueuedAction]
    queue_service: Mapping[str, QueuedAction]
    queue_api: Mapping[str, QueuedAction]
    running: Mapping[str, Running]
    estimates: Mapping[str, tuple[int, float]]
    service_demand: Mapping[str, tuple[float, float]]
    tenant_queued: Mapping[tuple[str, str], int]
    tenant_held: Mapping[tuple[str, str], TenantUse]
    env_flow: Mapping[str, float]
    node_layers: Mapping[str, Mapping[str, int]]
    image_layers: Mapping[str, tuple[LayerNeed, ...]]
    pulls: Mapping[str, PullState]
    env_pulls: Mapping[str, tuple[str, ...]]
    pull_rate: Mapping[str, float]
    env_footprint: Mapping[str, int]
    mem_peaks: Mapping[str, tuple[int, ...]]
    mem_waits: Mapping[str, int]
    mem_shortfall: Mapping[str, int]
    cpu_use: Mapping[str, tuple[int, float]]
    queued_deadlines: int

    def __init__(self, base: ClusterState, now_s: float) -> None:
        self.spec = base.spec
        self.now_s = now_s
        self.seq = base.seq
        self.queued_deadlines = base.queued_deadlines
        self._base = base
        for name in _TABLES:
            setattr(self, name, getattr(base, name))
        self._copied: set[str] = set()
        # Nodes whose situation changed this round (an action arrived, finished, an env got
        # ready). Pools elsewhere are as the last round left them, so policies may skip them.
        # "*" means every node (a wake-up, or an action not bound to a node).
        self.touched: set[str] = set()

    def w(self, name: str) -> dict[str, Any]:
        """The writable copy of table ``name`` (copied on first write this round)."""
        if name not in self._copied:
            frozen = getattr(self, name)
            # A frozen table is a read-only proxy of a dict: its ``copy()`` is the dict's own
            # (a fast C copy), where ``dict(proxy)`` reads it key by key (~13x slower, and it
            # runs for the running set on most rounds).
            setattr(self, name, frozen.copy() if isinstance(frozen, (dict, MappingProxyType)) else dict(frozen))
            self._copied.add(name)
        table: dict[str, Any] = getattr(self, name)
        return table

    def find_queued(self, action_id: str) -> QueuedAction | None:
        for lane in ("queue_cpu", "queue_service", "queue_api"):
            qa = getattr(self, lane).get(action_id)
            if qa is not None:
                return qa  # type: ignore[no-any-return]
        return None

    def touch(self, node_id: str | None) -> None:
        self.touched.add("*" if node_id is None else node_id)

    def is_touched(self, node_id: str) -> bool:
        return "*" in self.touched or node_id in self.touched

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def freeze(self) -> ClusterState:
        tables: dict[str, Any] = {
            n: MappingProxyType(getattr(self, n)) if n in self._copied else getattr(self, n) for n in _TABLES
        }
        return replace(self._base, spec=self.spec, now_s=self.now_s, seq=self.seq, queued_deadlines=self.queued_deadlines, **tables)

    def add_node_tables(self, node: CpuNodeSpec | GpuNodeSpec) -> None:
        """Free capacity for a node that just joined (``self.spec`` already lists it)."""
        if isinstance(node, CpuNodeSpec):
            numa = tuple(c * MILLICORES_PER_CORE for c in node.numa_cores)
            self.w("cpu")[node.node_id] = CpuFree(node.millicores, node.mem_bytes, numa)
        else:
            self.w("gpu")[node.node_id] = 0

    # --- CPU accounting -------------------------------------------------------------
    def take_cpu(self, node_id: str, demand: ResourceVector) -> tuple[int, ...]:
        """Take ``demand`` on a CPU node; returns millicores taken per NUMA domain.

        NUMA-aware: a grant that fits in one domain goes to the fullest domain that still
        holds it (keeps the other domains whole); a larger one spreads from the emptiest.
        """
        free = self.cpu[node_id]
        need = demand.cpu_millicores
        numa = list(free.numa_free)
        taken = [0] * len(numa)
        fitting = [d for d in range(len(numa)) if numa[d] >= need]
        if fitting:
            d = min(fitting, key=lambda i: (numa[i], i))
            taken[d] = need
        else:
            for d in sorted(range(len(numa)), key=lambda i: (-numa[i], i)):
                take = min(numa[d], need - sum(taken))
                taken[d] = take
        numa = [f - t for f, t in zip(numa, taken, strict=True)]
        self.w("cpu")[node_id] = CpuFree(
            free.free_millicores - need, free.free_mem_bytes - demand.mem_bytes, tuple(numa)
        )
        return tuple(taken)

    def give_cpu(self, node_id: str, demand: ResourceVector, numa_taken: tuple[int, ...]) -> None:
        free = self.cpu.get(node_id)
        if free is None:  # node lost meanwhile
            return
        if not numa_taken:  # memory-only holdings took no cores from any domain
            numa_taken = (0,) * len(free.numa_free)
        numa = tuple(f + t for f, t in zip(free.numa_free, numa_taken, strict=True))
        self.w("cpu")[node_id] = CpuFree(
            free.free_millicores + demand.cpu_millicores, free.free_mem_bytes + demand.mem_bytes, numa
        )

    # --- GPU accounting -------------------------------------------------------------
    def take_devices(self, node_id: str, offset: int, size: int) -> None:
        self.w("gpu")[node_id] = self.gpu[node_id] | chunk_mask(offset, size)

    def give_devices(self, node_id: str, offset: int, size: int) -> None:
        if node_id in self.gpu:
            self.w("gpu")[node_id] = self.gpu[node_id] & ~chunk_mask(offset, size)

    # --- quota accounting -----------------------------------------------------------
    def refill_quota(self, provider: str) -> QuotaFree:
        pool = self.spec.quota_pool(provider)
        q = self.quota[provider]
        if pool is None or q.refilled_s >= self.now_s:
            return q
        cap = float(pool.max_concurrency)
        bucket = min(cap, q.bucket + (self.now_s - q.refilled_s) * pool.rate_per_s)
        q = QuotaFree(q.free_tokens, bucket, self.now_s)
        self.w("quota")[provider] = q
        return q

    def take_quota(self, provider: str, tokens: int) -> None:
        q = self.refill_quota(provider)
        self.w("quota")[provider] = QuotaFree(q.free_tokens - tokens, max(0.0, q.bucket - 1.0), q.refilled_s)

    def give_quota(self, provider: str, tokens: int) -> None:
        q = self.quota.get(provider)
        if q is not None:
            self.w("quota")[provider] = QuotaFree(q.free_tokens + tokens, q.bucket, q.refilled_s)
