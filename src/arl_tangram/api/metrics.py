"""Shell: Prometheus metrics of one app instance (its own registry, so tests run several apps).

Two sources:
- events: each action submitted through the API observes its ACT split (queue / exec /
  overhead histograms) and its outcome when it ends; each controller round is read for
  swap-ins (``LoadService``) and evictions (``EvictService``) through the loop's round-log seam;
- snapshots at scrape time: queue length per lane, per-pool capacity / used / reserved and
  utilisation, sandboxes by state, GPU replicas by state, quota waits and upstream 429s from
  the API-quota manager's ``status()``. ``refresh`` takes it on the event loop (bookkeeping
  reads only) and the collector serves it.
``kind`` labels are the action types of the API (exec, code, service, api, noop): a bounded
set, where client-chosen labels would not be.

Who sees what: a series labelled ``tenant`` is its tenant's, shown to that tenant only;
the rest (pools, queue lengths, sandboxes, replicas, providers, rounds) describe the shared
service and are shown to every caller, as ``/v1/status`` does. The operator's scrape token
(``[service] metrics_token``) sees every tenant's series; so does every caller of a server
with no tokens (one tenant, ``default``, on loopback).
"""

from __future__ import annotations

import copy
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from arl_tangram.core import memory
from arl_tangram.core.decisions import EvictService, LoadService
from arl_tangram.runtime.actions import ActionRecord
from arl_tangram.runtime.loop import Round

# ACT parts range from tens of microseconds (a noop's queue) to minutes (a test suite)
BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ApiMetrics:
    """The instruments of one app; ``observe`` is called as each action ends."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("kind", "tenant")
        r = self.registry
        self.queue_s = Histogram("tangram_action_queue_seconds", "Queue part of the ACT", labels, registry=r, buckets=BUCKETS_S)
        self.exec_s = Histogram("tangram_action_exec_seconds", "Execution part of the ACT", labels, registry=r, buckets=BUCKETS_S)
        self.overhead_s = Histogram("tangram_action_overhead_seconds", "Overhead part of the ACT", labels, registry=r, buckets=BUCKETS_S)
        self.outcomes = Counter("tangram_actions", "Actions ended, by outcome", (*labels, "outcome"), registry=r)
        self.submitted = Counter("tangram_actions_submitted", "Actions accepted", labels, registry=r)
        self.rejected = Counter("tangram_http_overload", "Submissions refused for overload (429/503)", ("status",), registry=r)
        self.swap_ins = Counter("tangram_gpu_swap_ins", "Replica loads the controller decided (swap-ins)", registry=r)
        self.evictions = Counter("tangram_gpu_evictions", "Replica evictions the controller decided", registry=r)
        self.rounds = Counter("tangram_controller_rounds", "Controller rounds run", registry=r)
        self.pending = Gauge("tangram_pending_actions", "Actions submitted through the API and not ended", registry=r)
        self.snapshot = SnapshotCollector()
        r.register(self.snapshot)
        self.operator_token: str | None = None  # reads every tenant's series; None: nobody but a token-less server

    def submitted_one(self, kind: str, tenant: str) -> None:
        self.submitted.labels(kind, tenant).inc()

    def observe(self, record: ActionRecord) -> None:
        result = record.result
        if result is None:
            return
        kind, tenant = record.extra.get("type", "other"), record.spec.tenant
        self.queue_s.labels(kind, tenant).observe(result.queue_s)
        self.exec_s.labels(kind, tenant).observe(result.exec_s)
        self.overhead_s.labels(kind, tenant).observe(result.overhead_s)
        self.outcomes.labels(kind, tenant, result.outcome).inc()

    def on_round(self, round_: Round) -> None:
        self.rounds.inc()
        for d in round_.decisions:
            if isinstance(d, LoadService):
                self.swap_ins.inc()
            elif isinstance(d, EvictService):
                self.evictions.inc()

    def render(self, tenant: str | None = None) -> bytes:
        """The text exposition; ``tenant``: only that tenant's tenant-labelled series
        (None: every tenant's, for the operator)."""
        if tenant is None:
            return generate_latest(self.registry)
        return generate_latest(_TenantView(self.registry, tenant))  # type: ignore[arg-type]


class _TenantView:
    """The registry as one tenant may see it: samples labelled with another tenant dropped."""

    def __init__(self, registry: CollectorRegistry, tenant: str) -> None:
        self.registry = registry
        self.tenant = tenant

    def collect(self) -> Iterator[Any]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if s.labels.get("tenant", self.tenant) == self.tenant]
            if len(samples) != len(family.samples):
                family = copy.copy(family)
                family.samples = samples
            yield family


class SnapshotCollector(Collector):
    """Serves the last ``refresh`` snapshot: gauges and the counters other components keep."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def collect(self) -> Iterator[Any]:
        d = self.data
        queue = GaugeMetricFamily("tangram_queue_length", "Queued actions per lane", labels=("lane",))
        for lane, n in sorted(d.get("queue", {}).items()):
            queue.add_metric((lane,), n)
        yield queue
        families = {
            "capacity": GaugeMetricFamily("tangram_pool_capacity", "Capacity per pool", labels=("pool", "resource")),
            "used": GaugeMetricFamily("tangram_pool_used", "Used per pool", labels=("pool", "resource")),
            "reserved": GaugeMetricFamily("tangram_pool_reserved", "Reserved for the life of envs (memory, pod holdings) per pool", labels=("pool", "resource")),
            "utilisation": GaugeMetricFamily("tangram_pool_utilisation", "used / capacity per pool", labels=("pool", "resource")),
        }  # fmt: skip
        for pool in d.get("pools", []):
            key = (pool["pool"], pool["resource"])
            for name, family in families.items():
                family.add_metric(key, pool[name])
        yield from families.values()
        sandboxes = GaugeMetricFamily("tangram_sandboxes", "Sandboxes by state", labels=("state",))
        for state, n in sorted(d.get("sandboxes", {}).items()):
            sandboxes.add_metric((state,), n)
        yield sandboxes
        replicas = GaugeMetricFamily("tangram_gpu_replicas", "GPU replicas known to the manager, by state", labels=("state",))
        for state, n in sorted(d.get("replicas", {}).items()):
            replicas.add_metric((state,), n)
        yield replicas
        yield from _provider_families(d.get("providers", {}))
        yield from _memory_families(d.get("memory", {}))


def _memory_families(mem: dict[str, Any]) -> Iterator[Any]:
    for key, help_text in (
        ("footprint_bytes", "Idle footprints the envs hold (memory per action)"),
        ("granted_bytes", "Memory granted to running actions"),
        ("used_bytes", "Memory held on CPU nodes: footprints, grants and pods' limits"),
        ("paused_actions", "Actions paused at their memory grant, waiting for more"),
        ("pause_s", "Seconds the paused actions have waited so far"),
    ):
        family = GaugeMetricFamily(f"tangram_memory_{key}", help_text)
        family.add_metric((), mem.get(key, 0))
        yield family
    peaks = GaugeMetricFamily("tangram_memory_learned_peak_bytes", "Memory demand learned per action kind", labels=("kind",))
    for kind, value in sorted(mem.get("learned_peak_bytes", {}).items()):
        peaks.add_metric((kind,), value)
    yield peaks


def _provider_families(providers: dict[str, dict[str, Any]]) -> Iterator[Any]:
    waits = CounterMetricFamily("tangram_quota_waits", "Calls that waited for quota", labels=("provider",))
    upstream = CounterMetricFamily("tangram_upstream_429", "Upstream 429 answers", labels=("provider",))
    in_flight = GaugeMetricFamily("tangram_quota_in_flight", "Provider calls in flight", labels=("provider",))
    waiting = GaugeMetricFamily("tangram_quota_waiting", "Provider calls waiting for quota", labels=("provider",))
    for name, s in sorted(providers.items()):
        waits.add_metric((name,), s.get("waits", 0))
        upstream.add_metric((name,), s.get("upstream_429s", 0))
        in_flight.add_metric((name,), s.get("in_flight", 0))
        waiting.add_metric((name,), s.get("waiting", 0))
    yield from (waits, upstream, in_flight, waiting)


def take_snapshot(runtime: Any) -> dict[str, Any]:
    """Queue, pools, sandboxes, replicas and providers as of now (event-loop thread: the
    controller's state is read between rounds; manager reads are bookkeeping only)."""
    state = runtime.controller.loop.state
    agent = runtime.agent
    return {
        "queue": {"cpu": len(state.queue_cpu), "service": len(state.queue_service), "api": len(state.queue_api)},
        "pools": pools(state),
        "sandboxes": _sandboxes(agent.cpu),
        "replicas": _replicas(agent.gpu),
        "providers": agent.api.status() if agent.api is not None else {},
        "memory": memory_view(state, runtime.controller.clock.now()),
    }


def memory_view(state: Any, now_s: float) -> dict[str, Any]:
    """Memory per action (``core.memory``) at a glance: the idle footprints the envs hold,
    the running actions' grants, the used total, the paused actions and how long they have
    waited, and the demand learned per kind."""


    ed = state.edit(state.now_s)
    footprint = sum(e.held.mem_bytes for e in state.envs.values() if e.per_action_memory)
    granted = sum(r.grant.mem_bytes for r in state.running.values())
    used = sum(n.mem_bytes - state.cpu[n.node_id].free_mem_bytes for n in state.spec.cpu_nodes if n.node_id in state.cpu)
    paused = [state.running[a] for a in state.mem_waits if a in state.running]
    pause_s = sum(max(0.0, now_s - (r.paused_since_s or now_s)) for r in paused)
    learned = {k: memory.learned_peak(ed, k) for k in sorted(state.mem_peaks)}
    return {
        "footprint_bytes": footprint, "granted_bytes": granted, "used_bytes": used, "paused_actions": len(paused),
        "pause_s": pause_s, "learned_peak_bytes": {k: v for k, v in learned.items() if v is not None},
    }  # fmt: skip


def pools(state: Any) -> list[dict[str, Any]]:
    """Per pool and resource: capacity, used, reserved (held for an env's life), utilisation."""
    out: list[dict[str, Any]] = []
    env_mem: Tally[str] = Tally()
    env_held: Tally[str] = Tally()
    for env in state.envs.values():
        if env.node_id is not None:
            env_mem[env.node_id] += env.spec.mem_bytes
            env_held[env.node_id] += env.held.cpu_millicores
    for n in state.spec.cpu_nodes:
        free = state.cpu.get(n.node_id)
        if free is None:
            continue
        out.append(_pool(n.node_id, "cpu_millicores", n.millicores, n.millicores - free.free_millicores, env_held[n.node_id]))
        out.append(_pool(n.node_id, "mem_bytes", n.mem_bytes, n.mem_bytes - free.free_mem_bytes, env_mem[n.node_id]))
    for g in state.spec.gpu_nodes:
        used = bin(state.gpu.get(g.node_id, 0)).count("1")
        resident = sum(r.size for r in state.replicas.values() if r.node_id == g.node_id)
        out.append(_pool(g.node_id, "gpu_devices", g.devices, used, resident))
    for q in state.spec.quota_pools:
        free_q = state.quota.get(q.provider)
        used = q.max_concurrency - (free_q.free_tokens if free_q else q.max_concurrency)
        out.append(_pool(q.provider, "quota_tokens", q.max_concurrency, used, 0))
    return out


def _pool(pool: str, resource: str, capacity: int, used: int, reserved: int) -> dict[str, Any]:
    return {
        "pool": pool, "resource": resource, "capacity": capacity, "used": used, "reserved": reserved,
        "utilisation": used / capacity if capacity else 0.0,
    }  # fmt: skip


def _sandboxes(cpu: Any) -> dict[str, int]:
    if cpu is None:
        return {}
    tally: Tally[str] = Tally()
    for sandbox_id in cpu.list_sandboxes():
        try:
            tally[str(cpu.get_sandbox(sandbox_id).state)] += 1
        except Exception:  # destroyed since the listing
            continue
    return dict(tally)


def _replicas(gpu: Any) -> dict[str, int]:
    if gpu is None:
        return {}
    return dict(Tally(r["state"] for r in gpu.status()["replicas"].values()))
