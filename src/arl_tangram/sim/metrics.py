"""Sim: per-action and per-trajectory records, and their summaries (ACT split, step, utilisation)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ActionRecord:
    action_id: str
    kind: str
    category: str
    submit_s: float
    start_s: float | None = None  # scheduler's start decision
    exec_start_s: float | None = None  # the action's own code starts running
    end_s: float | None = None
    dop: int = 0
    outcome: str = ""
    retries: int = 0  # 429s answered by the provider (unmanaged API calls)

    @property
    def queue_s(self) -> float:
        return (self.start_s or 0.0) - self.submit_s

    @property
    def overhead_s(self) -> float:
        return (self.exec_start_s or 0.0) - (self.start_s or 0.0)

    @property
    def exec_s(self) -> float:
        return (self.end_s or 0.0) - (self.exec_start_s or 0.0)

    @property
    def act_s(self) -> float:
        return (self.end_s or 0.0) - self.submit_s


@dataclass
class Intervals:
    """Time intervals weighted by an amount (cores, devices): reserved or used capacity."""

    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    amounts: list[float] = field(default_factory=list)

    def add(self, start_s: float, end_s: float, amount: float) -> None:
        if end_s > start_s and amount:
            self.starts.append(start_s)
            self.ends.append(end_s)
            self.amounts.append(amount)

    def integral(self) -> float:
        return float(np.sum((np.array(self.ends) - np.array(self.starts)) * np.array(self.amounts)))

    def series(self, horizon_s: float, bins: int = 200) -> tuple[np.ndarray, np.ndarray]:
        """Mean amount held in each of ``bins`` equal slices of [0, horizon]."""
        edges = np.linspace(0.0, horizon_s, bins + 1)
        out = np.zeros(bins)
        if self.starts:
            s, e, a = np.array(self.starts), np.array(self.ends), np.array(self.amounts)
            for i in range(bins):
                overlap = np.clip(np.minimum(e, edges[i + 1]) - np.maximum(s, edges[i]), 0.0, None)
                out[i] = float(np.sum(overlap * a)) / (edges[i + 1] - edges[i])
        return edges[:-1], out


@dataclass
class Metrics:
    actions: dict[str, ActionRecord] = field(default_factory=dict)
    trajectory_end_s: dict[str, float] = field(default_factory=dict)
    reserved: dict[str, Intervals] = field(default_factory=lambda: defaultdict(Intervals))  # by resource
    used: dict[str, Intervals] = field(default_factory=lambda: defaultdict(Intervals))
    rejected: int = 0

    def done(self) -> list[ActionRecord]:
        return [r for r in self.actions.values() if r.end_s is not None]

    def step_s(self) -> float:
        return max(self.trajectory_end_s.values(), default=0.0)

    def act_summary(self, category: str | None = None) -> dict[str, float]:
        recs = [r for r in self.done() if category is None or r.category == category]
        if not recs:
            return {"count": 0}
        act = np.array([r.act_s for r in recs])
        return {
            "count": len(recs),
            "mean_s": float(act.mean()),
            "p50_s": float(np.percentile(act, 50)),
            "p99_s": float(np.percentile(act, 99)),
            "queue_s": float(np.mean([r.queue_s for r in recs])),
            "exec_s": float(np.mean([r.exec_s for r in recs])),
            "overhead_s": float(np.mean([r.overhead_s for r in recs])),
            "retries": int(sum(r.retries for r in recs)),
        }

    def env_busy_fraction(self, categories: tuple[str, ...] = ("env", "reward")) -> float:
        """Share of the trajectories' lives their sandbox spends executing an action
        (PAPER: 47% on AI coding). Lives run from the step's start (every simulated
        trajectory starts at 0) to the trajectory's end, so a pod's start counts as idle."""
        life = sum(self.trajectory_end_s.values())
        busy = sum(r.exec_s for r in self.done() if r.category in categories)
        return busy / life if life else 0.0

    def utilisation(self, resource: str, capacity: float) -> dict[str, float]:
        """Mean reserved and used amounts over the step, and as fractions of ``capacity``."""
        step = self.step_s() or 1.0
        reserved = self.reserved[resource].integral() / step
        used = self.used[resource].integral() / step
        return {
            "capacity": capacity,
            "reserved_mean": reserved,
            "used_mean": used,
            "reserved_frac": reserved / capacity if capacity else 0.0,
            "used_frac": used / capacity if capacity else 0.0,
            "used_of_reserved": used / reserved if reserved else 0.0,
        }
