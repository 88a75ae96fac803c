"""Sim: a capacity-respecting lower bound on the total (and mean) ACT of a set of actions.

The unlimited "ideal" (every action at its widest DoP at once) ignores that the pool has
``C`` cores; this bound keeps them. Instance: actions ``i`` with arrival ``r_i``, a fixed
overhead ``o`` before execution, and a true duration ``T_i(m)`` for each allowed DoP ``m``
(``T_i(m) = inf`` where not allowed); at DoP ``m`` an action holds ``m`` cores while it
executes. A schedule picks for each action an execution start ``e_i >= r_i + o`` and a DoP
``m_i`` (fixed for its run) so that at every time the cores in use are at most ``C``; its
total ACT is ``Σ (e_i - r_i) + T_i(m_i)``. Node boundaries (an env pinned to its node)
are relaxed away, so the bound holds for the real system, which obeys them too.

Derivation (Lagrangian relaxation of the capacity constraint). For any price
``λ(t) >= 0`` and any feasible schedule, ``∫ λ(t) (usage(t) - C) dt <= 0``, so

    Σ ACT_i  >=  Σ_i [ (e_i - r_i) + T_i(m_i) + m_i ∫_{e_i}^{e_i+T_i(m_i)} λ ]  -  C ∫ λ
             >=  Σ_i  min_{m, e >= r_i+o} [ (e - r_i) + T_i(m) + m Λ(e, e + T_i(m)) ]  -  C ∫ λ
             =: D(λ).

Each action's inner minimum is separate, so ``D(λ)`` is cheap to evaluate and every
``λ >= 0`` gives a valid bound; ``λ = 0`` gives the unlimited ideal (``o + min_m T_i(m)``
each), so the bound is never below it. ``λ`` is piecewise constant on bins of ``bin_s``;
``D`` is concave in it and a projected subgradient ascent (the subgradient of bin ``k`` is
the chosen schedule's core-seconds in the bin minus ``C · bin_s``) keeps the best value.

The inner minimum is taken exactly enough to stay a bound: for a fixed ``m`` the cost in
``e`` is piecewise linear with breakpoints where ``e`` or ``e + T`` crosses a bin edge, so
its minimum over ``[e0, e0 + W]`` lies on ``e0`` or one of those breakpoints, all of which
are evaluated; starting later than ``e0 + W`` costs at least the delay ``W``, which is
used as the (lower) value of that region when it could matter.

Caveat, said plainly: the bound is for the arrivals given (in the simulator, the arrivals
the measured run saw). In a closed loop a different schedule would shift later arrivals,
so it bounds the run's mean ACT on its own arrival trace, not every policy's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind
from arl_tangram.sim.metrics import ActionRecord
from arl_tangram.sim.workload import TrajectoryPlan

DOP_INFEASIBLE = float("inf")


@dataclass(frozen=True)
class BoundInstance:
    """``durations[i, m-1]`` = T_i(m) (inf where DoP m is not allowed); ``arrivals_s[i]`` = r_i."""

    arrivals_s: np.ndarray
    durations: np.ndarray
    capacity: int
    overhead_s: float = 0.0

    @classmethod
    def of(cls, arrivals_s: Sequence[float], durations: Sequence[Sequence[float]], capacity: int, overhead_s: float = 0.0) -> BoundInstance:
        width = max(len(row) for row in durations)
        table = np.full((len(durations), width), DOP_INFEASIBLE)
        for i, row in enumerate(durations):
            table[i, : len(row)] = row
        table[:, capacity:] = DOP_INFEASIBLE  # no action can hold more than the pool
        return cls(np.asarray(arrivals_s, dtype=float), table, capacity, overhead_s)


@dataclass(frozen=True)
class BoundResult:
    total_s: float
    mean_s: float
    ideal_mean_s: float  # the same instance with λ = 0: no capacity limit
    iterations: int


@dataclass(frozen=True)
class _Candidates:
    """What the inner minimum evaluates that does not depend on ``λ``, built once per bound.

    Only allowed (action, DoP) pairs are kept (a command allows one DoP of 32), as flat
    arrays in row-major order. The start candidates ``e0`` and the bin edges after it are
    the same for every DoP of an action, so their ``Λ`` is taken once per action. Each value
    is the same elementwise expression as on the full table, so the bound is unchanged."""

    rows: np.ndarray  # (P,) action of each pair
    cols: np.ndarray  # (P,) DoP - 1 of each pair
    t: np.ndarray  # (P,) T_i(m)
    dops: np.ndarray  # (P,) m, as float
    row_starts: np.ndarray  # (n, 1 + W) e0 and the bin edges after it, clipped to the horizon
    end_starts: np.ndarray  # (P, W) bin edges after e0 + T, minus T, clipped
    starts: np.ndarray  # (P, 1 + 2W) every candidate start
    starts_plus_t: np.ndarray  # (P, 1 + 2W) every candidate start + T
    delay: np.ndarray  # (P, 1 + 2W) every candidate start - e0

    @classmethod
    def of(cls, inst: BoundInstance, horizon: float, bin_s: float, window_bins: int) -> _Candidates:
        rows, cols = np.nonzero(np.isfinite(inst.durations))
        t = inst.durations[rows, cols]
        e0_row = inst.arrivals_s + inst.overhead_s
        j = np.arange(window_bins)
        first_edge = np.ceil(e0_row / bin_s)[:, None] * bin_s + j * bin_s
        row_starts = np.minimum(np.concatenate([e0_row[:, None], first_edge], axis=-1), np.maximum(horizon, e0_row[:, None]))
        e0 = e0_row[rows][:, None]
        first_end = np.ceil((e0 + t[:, None]) / bin_s) * bin_s + j * bin_s - t[:, None]
        end_starts = np.minimum(np.maximum(first_end, e0), np.maximum(horizon, e0))
        cands = np.concatenate([row_starts[rows], end_starts], axis=-1)
        return cls(rows, cols, t, cols + 1.0, row_starts, end_starts, cands, cands + t[:, None], cands - e0)


def _inner(inst: BoundInstance, lam: np.ndarray, bin_s: float, window_bins: int, cand: _Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per action: the inner minimum's value (a lower bound of it), and its (start, dop, duration)."""
    n, width = inst.durations.shape
    edges_cum = np.concatenate(([0.0], np.cumsum(lam) * bin_s))  # Λ at bin edges
    grid = np.arange(len(lam) + 1) * bin_s

    def big_l(x: np.ndarray) -> np.ndarray:  # Λ(0, x); λ = 0 beyond the grid
        return np.interp(x, grid, edges_cum)

    at_start = np.concatenate([big_l(cand.row_starts)[cand.rows], big_l(cand.end_starts)], axis=-1)
    cost = cand.delay + cand.dops[:, None] * (big_l(cand.starts_plus_t) - at_start)
    k = np.argmin(cost, axis=-1)
    pairs = np.arange(len(k))
    best = cost[pairs, k]
    # Beyond the evaluated breakpoints a start costs at least its delay.
    covered = (window_bins - 1) * bin_s
    best = np.minimum(best, covered)
    total = np.full((n, width), np.inf)
    total[cand.rows, cand.cols] = best + inst.overhead_s + cand.t
    pair_of = np.zeros((n, width), dtype=np.intp)
    pair_of[cand.rows, cand.cols] = pairs
    m_idx = np.argmin(total, axis=1)
    rows = np.arange(n)
    chosen = pair_of[rows, m_idx]
    values = total[rows, m_idx]
    # An action with no allowed DoP (none in a simulated run) holds nothing: duration 0.
    durs = np.where(np.isfinite(values), cand.t[chosen], 0.0)
    return values, cand.starts[chosen, k[chosen]], m_idx + 1.0, durs


def _usage(starts: np.ndarray, dops: np.ndarray, durs: np.ndarray, bins: int, bin_s: float) -> np.ndarray:
    """Core-seconds the chosen runs use in each bin: ∫ Σ m_i 1[e_i <= t < e_i + T_i] over the bin."""
    grid = np.arange(bins + 1) * bin_s

    def ramp(points: np.ndarray) -> np.ndarray:  # Σ_i m_i (x - p_i)^+ at every grid x
        order = np.argsort(points)
        p, w = points[order], dops[order]
        cw, cwp = np.concatenate(([0.0], np.cumsum(w))), np.concatenate(([0.0], np.cumsum(w * p)))
        idx = np.searchsorted(p, grid, side="right")
        return grid * cw[idx] - cwp[idx]

    held = ramp(starts) - ramp(starts + durs)
    return np.diff(held)


def capacity_bound(inst: BoundInstance, bin_s: float = 0.5, iterations: int = 60, window_bins: int = 8, step: float = 0.02) -> BoundResult:
    """The best ``D(λ)`` found by projected subgradient ascent from ``λ = 0``; deterministic."""
    n = len(inst.arrivals_s)
    if n == 0:
        return BoundResult(0.0, 0.0, 0.0, 0)
    longest = float(np.max(np.where(np.isfinite(inst.durations), inst.durations, 0.0)))
    bins = int(np.ceil((float(inst.arrivals_s.max()) + inst.overhead_s + longest + window_bins * bin_s) / bin_s)) + 1
    lam = np.zeros(bins)
    cand = _Candidates.of(inst, bins * bin_s, bin_s, window_bins)
    best = -np.inf
    ideal = 0.0
    done = 0
    for it in range(iterations):
        values, starts, dops, durs = _inner(inst, lam, bin_s, window_bins, cand)
        dual = float(values.sum()) - inst.capacity * float(lam.sum()) * bin_s
        if it == 0:
            ideal = float(values.sum())
        best = max(best, dual)
        done = it + 1
        over = _usage(starts, dops, durs, bins, bin_s) / bin_s - inst.capacity  # mean cores over C per bin
        norm = float(np.linalg.norm(over))
        if norm == 0.0:
            break
        lam = np.maximum(0.0, lam + step / np.sqrt(it + 1.0) * over / norm * np.sqrt(bins))
    return BoundResult(best, best / n, ideal / n, done)


def amdahl_row(t_ori_s: float, serial: float, dop_min: int, dop_max: int) -> list[float]:
    """T(m) for m = 1..dop_max under Amdahl's law, inf below ``dop_min``."""
    return [DOP_INFEASIBLE if m < dop_min else t_ori_s * (serial + (1.0 - serial) / m) for m in range(1, dop_max + 1)]


def instance_from_run(trajectories: Sequence[TrajectoryPlan], records: Mapping[str, ActionRecord], capacity: int, overhead_s: float) -> BoundInstance:
    """The bound's instance for the CPU actions a simulated run executed: their arrivals as
    the run saw them, their true durations (the templates' curves and ``T_ori``).

    Action ids follow the simulator's ``"<trajectory>/<phase>"``. Only actions that hold
    whole cores per unit of DoP (or one fixed core) are modelled, which is every coding action.
    """
    templates = {f"{p.trajectory_id}/{k}": tpl for p in trajectories for k, (_, tpl) in enumerate(p.phases)}
    arrivals: list[float] = []
    rows: list[list[float]] = []
    for action_id in sorted(records):
        rec, tpl = records[action_id], templates.get(action_id)
        if tpl is None or tpl.binding_kind != "env" or rec.end_s is None:
            continue
        if tpl.key is ResourceKind.CPU:
            if tpl.per_unit.cpu_millicores != MILLICORES_PER_CORE or tpl.fixed.cpu_millicores:
                raise ValueError(f"{action_id}: the bound models one core per unit of DoP")
            rows.append([DOP_INFEASIBLE if m < tpl.dop_min else tpl.elasticity.duration_s(tpl.t_ori_s, m) for m in range(1, tpl.dop_max + 1)])
        else:
            rows.append([tpl.elasticity.duration_s(tpl.t_ori_s, 1)])
        arrivals.append(rec.submit_s)
    return BoundInstance.of(arrivals, rows, capacity, overhead_s)
