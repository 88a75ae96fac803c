"""Sim: demoted (preempted) CPU runs, as the live manager runs them (issue 26).

The core's own ``PreemptAction`` (``core.preemption``) is what demotes a run here, so the
simulator exercises the same policy code as the live service. Mechanism, as
``managers/cpu/preempt.py`` runs it: a demoted run gives its cores back and keeps running at
the floor CPU weight, so it progresses only on the cores the node's granted (top-level)
runs leave idle, shared equally between the node's demoted runs, at most one core each
(they are single-core actions). Granted runs are assumed to use all of their grant; the
weight's aging (``preempt.AGING_S``) is not modelled, which only delays demoted runs here.

Work is counted in seconds at one core: a run demoted ``r`` seconds before its planned end
has ``r`` left. Every change of a node's granted cores or demoted set re-plans its demoted
runs' ends; a planned end that a later re-plan moved is ignored when it fires (``token``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from arl_tangram.sim.engine import EventQueue


@dataclass
class _Demoted:
    left_s: float  # work left, in seconds at one core
    since_s: float  # when ``left_s`` was last brought up to date
    rate: float  # cores it gets now
    token: int
    done: Callable[[], None]


class DemotedRuns:
    """Per node: the cores granted runs hold and the demoted runs sharing the rest."""

    def __init__(
        self, queue: EventQueue, cores_by_node: dict[str, float], on_progress: Callable[[float, float, float], None] | None = None
    ) -> None:
        """``on_progress(start_s, end_s, cores)``: a demoted run used ``cores`` over that span."""
        self.q = queue
        self.on_progress = on_progress
        self.cores = dict(cores_by_node)
        self.granted: dict[str, float] = {}
        self.runs: dict[str, dict[str, _Demoted]] = {}
        self._tokens = 0

    def hold(self, node_id: str, cores: float) -> None:
        """A granted run starts (``cores`` > 0) or gives its cores back (< 0)."""
        self.granted[node_id] = self.granted.get(node_id, 0.0) + cores
        self._replan(node_id)

    def demote(self, node_id: str, action_id: str, left_s: float, done: Callable[[], None]) -> None:
        """``action_id`` (its cores already given back with ``hold``) runs on demoted;
        ``done()`` is called when its ``left_s`` of work is done."""
        self.runs.setdefault(node_id, {})[action_id] = _Demoted(max(0.0, left_s), self.q.now_s, 0.0, 0, done)
        self._replan(node_id)

    def _replan(self, node_id: str) -> None:
        runs = self.runs.get(node_id)
        if not runs:
            return
        now = self.q.now_s
        idle = max(0.0, self.cores.get(node_id, 0.0) - self.granted.get(node_id, 0.0))
        rate = min(1.0, idle / len(runs))
        for action_id, run in runs.items():
            if self.on_progress is not None and run.rate > 0:
                self.on_progress(run.since_s, now, run.rate)
            run.left_s = max(0.0, run.left_s - run.rate * (now - run.since_s))
            run.since_s, run.rate = now, rate
            self._tokens += 1
            run.token = self._tokens
            if rate > 0:
                self.q.at(now + run.left_s / rate, self._ender(node_id, action_id, run.token))

    def _ender(self, node_id: str, action_id: str, token: int) -> Callable[[], None]:
        def end() -> None:
            run = self.runs.get(node_id, {}).get(action_id)
            if run is None or run.token != token:
                return  # re-planned since
            if self.on_progress is not None:
                self.on_progress(run.since_s, self.q.now_s, run.rate)
            del self.runs[node_id][action_id]
            self._replan(node_id)
            run.done()

        return end
