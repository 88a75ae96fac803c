"""Sim: simulated managers, the simulator's executor on the shared controller loop. They
carry out decisions with the platform's latencies and report back the events a real
manager would (EnvReady, ServiceReady, ActionFinished), repeating each decision's stimulus id.

Mechanism only: they never decide anything a policy should.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from arl_tangram.core.decisions import (
    CancelAction,
    EvictService,
    LoadService,
    PlaceEnv,
    PreemptAction,
    RejectAction,
    ReleaseEnv,
    StartAction,
)
from arl_tangram.core.events import ActionFinished, EnvReady, Event, ServiceReady
from arl_tangram.core.resources import MILLICORES_PER_CORE
from arl_tangram.core.topology import ClusterSpec
from arl_tangram.runtime.loop import Executor
from arl_tangram.sim.demoted import DemotedRuns
from arl_tangram.sim.engine import EventQueue
from arl_tangram.sim.metrics import ActionRecord, Metrics
from arl_tangram.sim.platform import Platform
from arl_tangram.sim.workload import ActionTemplate

MAX_BACKOFF_S = 30.0  # client-side exponential backoff cap (assumption: common client default)


class ProviderLimit:
    """The API provider's own limit: at most ``rate_per_s`` calls accepted in any 1 s window."""

    def __init__(self, rate_per_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.accepted: deque[float] = deque()

    def admit(self, now_s: float) -> bool:
        while self.accepted and self.accepted[0] <= now_s - 1.0:
            self.accepted.popleft()
        if len(self.accepted) >= self.rate_per_s:
            return False
        self.accepted.append(now_s)
        return True


class SimManagers(Executor):
    """``instant_loads``: replicas load in zero time (static deployments up before the step)."""

    def __init__(
        self,
        queue: EventQueue,
        cluster: ClusterSpec,
        platform: Platform,
        metrics: Metrics,
        templates: dict[str, ActionTemplate],
        emit: Callable[[Event], object],
        on_done: Callable[[str, str], None],
        seed: int,
    ) -> None:
        self.q = queue
        self.cluster = cluster
        self.platform = platform
        self.metrics = metrics
        self.templates = templates
        self.emit = emit
        self.on_done = on_done
        self.rng = random.Random(seed)
        self.replica_ready_at: dict[str, float] = {}
        self.replica_loaded_at: dict[str, tuple[float, int]] = {}
        self.env_held: dict[str, tuple[float, int]] = {}
        self.providers = {p.provider: ProviderLimit(p.rate_per_s) for p in cluster.quota_pools}
        self.instant_loads = False
        # preemption (issue 26): the core's PreemptAction demotes a granted CPU run
        cores = {n.node_id: float(sum(n.numa_cores)) for n in cluster.cpu_nodes}
        self.demoted = DemotedRuns(queue, cores, lambda a, b, x: self.metrics.used["cpu"].add(a, b, x))
        self.cpu_runs: dict[str, tuple[str, float, float]] = {}  # granted CPU run -> (node, cores, planned end)
        self.finishers: dict[str, Callable[[], None]] = {}  # running action -> what ends it

    def _report(self, event: Event) -> None:
        self.emit(event)

    def reject_action(self, d: RejectAction) -> None:
        self.metrics.rejected += 1
        self.on_done(d.action_id, d.outcome)

    def cancel_action(self, d: CancelAction) -> None:
        raise AssertionError("the simulated clients never cancel a running action")

    def evict_service(self, d: EvictService) -> None:
        self._evict(d.replica_id)

    def place_env(self, d: PlaceEnv) -> None:
        self.env_held[d.env_id] = (self.q.now_s, d.held.cpu_millicores)
        ready = EnvReady(d.env_id, stimulus_id=d.stimulus_id)
        self.q.after(self.platform.env_start_s(self.rng), lambda: self._report(ready))

    def release_env(self, d: ReleaseEnv) -> None:
        placed = self.env_held.pop(d.env_id, None)
        if placed and placed[1]:
            self.metrics.reserved["cpu"].add(placed[0], self.q.now_s, placed[1] / MILLICORES_PER_CORE)

    def load_service(self, d: LoadService) -> None:
        service = self.cluster.services[d.service]
        load_s = 0.0 if self.instant_loads else service.weight_bytes / d.size / (self.platform.host_to_device_gbps * 1e9)
        self.replica_ready_at[d.replica_id] = self.q.now_s + load_s
        self.replica_loaded_at[d.replica_id] = (self.q.now_s, d.size)
        ready = ServiceReady(d.replica_id, stimulus_id=d.stimulus_id)
        self.q.after(load_s, lambda: self._report(ready))

    def _evict(self, replica_id: str) -> None:
        loaded = self.replica_loaded_at.pop(replica_id, None)
        self.replica_ready_at.pop(replica_id, None)
        if loaded:
            self.metrics.reserved["gpu"].add(loaded[0], self.q.now_s, loaded[1])

    def close(self) -> None:
        """At the end of a run, account for what is still held."""
        for env_id in list(self.env_held):
            self.release_env(ReleaseEnv(env_id, None, "end of the run", "close"))
        for replica_id in list(self.replica_loaded_at):
            self._evict(replica_id)

    def start_action(self, d: StartAction) -> None:
        tpl = self.templates[d.action_id]
        rec = self.metrics.actions[d.action_id]
        rec.start_s = self.q.now_s
        rec.dop = d.dop
        exec_s = tpl.elasticity.duration_s(tpl.t_ori_s, d.dop)
        if tpl.binding_kind == "env":
            self._run(d, rec, self.platform.action_overhead_s, exec_s, "cpu")
        elif tpl.binding_kind == "service":
            wait = max(0.0, self.replica_ready_at.get(d.replica_id or "", self.q.now_s) - self.q.now_s)
            self._run(d, rec, wait, exec_s, "gpu")
        elif d.grant.quota_tokens:  # managed: the global bucket already paced it
            self.providers[tpl.binding_name].admit(self.q.now_s)
            self._run(d, rec, 0.0, exec_s, "api")
        else:
            self._call_unmanaged(d, rec, exec_s, attempt=0)

    def _run(self, d: StartAction, rec: ActionRecord, overhead_s: float, exec_s: float, resource: str) -> None:
        exec_start = rec.exec_start_s = self.q.now_s + overhead_s
        tpl = self.templates[d.action_id]
        end = exec_start + exec_s
        cores = d.grant.cpu_millicores / MILLICORES_PER_CORE
        if resource == "cpu":
            self.metrics.reserved["cpu"].add(self.q.now_s, end, cores)  # held from the start decision
            self.metrics.used["cpu"].add(rec.exec_start_s, end, tpl.elasticity.speedup(d.dop))
            self.cpu_runs[d.action_id] = (d.node_id, cores, end)
            self.demoted.hold(d.node_id, cores)
        elif resource == "gpu":
            self.metrics.used["gpu"].add(rec.exec_start_s, end, tpl.elasticity.speedup(d.dop))

        def finish() -> None:
            rec.end_s = self.q.now_s
            rec.outcome = "succeeded"
            ran_s = exec_s if rec.end_s <= end else rec.end_s - exec_start  # a demoted run ran longer
            self.finishers.pop(d.action_id, None)
            self.emit(ActionFinished(d.action_id, "succeeded", ran_s, stimulus_id=d.stimulus_id))
            self.on_done(d.action_id, "succeeded")

        def planned_end() -> None:
            if resource == "cpu":
                if self.cpu_runs.pop(d.action_id, None) is None:
                    return  # demoted: ``DemotedRuns`` ends it
                self.demoted.hold(d.node_id, -cores)
            finish()

        self.finishers[d.action_id] = finish
        self.q.at(end, planned_end)

    def preempt_action(self, d: PreemptAction) -> None:
        """The core demoted a granted CPU run: its cores go back, it runs on on what the
        node's granted runs leave idle (``sim.demoted``)."""
        run = self.cpu_runs.pop(d.action_id, None)
        finish = self.finishers.get(d.action_id)
        if run is None or finish is None:
            return  # ended in the same instant
        node_id, cores, end = run
        now = self.q.now_s
        self.metrics.reserved["cpu"].add(now, end, -cores)  # no longer held from now on
        self.metrics.used["cpu"].add(max(now, self.metrics.actions[d.action_id].exec_start_s or now), end, -1.0)  # nor used at one core
        self.demoted.hold(node_id, -cores)
        self.demoted.demote(node_id, d.action_id, end - now, finish)

    def _call_unmanaged(self, d: StartAction, rec: ActionRecord, exec_s: float, attempt: int) -> None:
        provider = self.providers[self.templates[d.action_id].binding_name]
        if provider.admit(self.q.now_s):
            self._run(d, rec, 0.0, exec_s, "api")  # time lost to 429s before this counts as overhead
            return
        rec.retries += 1
        backoff = self.rng.uniform(0.0, min(MAX_BACKOFF_S, 2.0**attempt))  # full jitter
        self.q.after(self.platform.api_rtt_s + backoff, lambda: self._call_unmanaged(d, rec, exec_s, attempt + 1))
