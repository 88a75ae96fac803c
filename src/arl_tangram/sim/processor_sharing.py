"""Sim: the processor-sharing baseline (issue 26): every action runs at once, the cores
shared equally, as CFS shares them between Burstable pods or SandboxFusion's runs.

Model, on a ``BoundInstance`` (``sim/bound.py``: arrivals ``r_i``, true durations
``T_i(m)``, ``C`` cores, a fixed overhead ``o`` before execution): while ``n`` actions
execute, each gets ``x = min(dop_max_i, C / n)`` cores; at ``x`` cores it progresses at
``1 / T_i(floor(x))`` of its work per second, and below its smallest allowed DoP ``m0``
linearly less (``x / m0`` of the rate at ``m0``: a program on a fraction of a core runs
that much slower). Cores an action cannot use (``x`` capped at ``dop_max``) are not
redistributed, as the issue's rule states. Node boundaries are relaxed (one pool of ``C``),
which favours this baseline.

Caveat, said plainly: like the bound, it replays the arrivals a measured run saw (open
loop); under processor sharing a closed-loop workload would shift later arrivals.
"""

from __future__ import annotations

import math

import numpy as np

from arl_tangram.sim.bound import BoundInstance


def _rates(durations: np.ndarray, idx: np.ndarray, first_dop: np.ndarray, dop_max: np.ndarray, share: float) -> np.ndarray:
    """Work fraction per second of each ``idx`` action at ``share`` cores (capped at its dop_max)."""
    x = np.minimum(dop_max.astype(float), share)
    m = np.clip(np.floor(x).astype(int), 1, None)
    m = np.maximum(m, first_dop)
    at_m = 1.0 / durations[idx, m - 1]  # only the entries used: no copy of the rows
    below = x < first_dop
    return np.where(below, at_m * x / first_dop, at_m)


def processor_sharing_mean_act_s(inst: BoundInstance) -> float:
    """Mean ACT (overhead + execution under processor sharing) over the instance's actions."""
    n_actions = len(inst.arrivals_s)
    if n_actions == 0:
        return 0.0
    durations = np.asarray(inst.durations, dtype=float)
    finite = np.isfinite(durations)
    if not finite.any(axis=1).all():
        raise ValueError("every action needs a DoP that fits the pool (a finite duration)")
    first_dop = finite.argmax(axis=1) + 1
    dop_max = finite.shape[1] - finite[:, ::-1].argmax(axis=1)
    order = np.argsort(inst.arrivals_s, kind="stable")
    starts = np.asarray(inst.arrivals_s, dtype=float)[order] + inst.overhead_s
    idx = np.empty(0, dtype=np.intp)  # the active actions, in arrival order
    left = np.ones(n_actions)
    end = np.zeros(n_actions)
    now, k = (float(starts[0]) if n_actions else 0.0), 0
    while k < n_actions or idx.size:
        arrived = max(k, int(np.searchsorted(starts, now, side="right")))  # starts are sorted
        if arrived > k:
            idx = np.concatenate([idx, order[k:arrived]])
            k = arrived
        if not idx.size:
            now = float(starts[k])
            continue
        rate = _rates(durations, idx, first_dop[idx], dop_max[idx], inst.capacity / len(idx))
        to_finish = left[idx] / rate
        step = float(to_finish.min())
        next_arrival = float(starts[k]) - now if k < n_actions else math.inf
        step = min(step, next_arrival)
        left[idx] -= rate * step
        now += step
        done = left[idx] <= 1e-12
        end[idx[done]] = now
        idx = idx[~done]
    arrivals = np.asarray(inst.arrivals_s, dtype=float)
    return float((end - arrivals).mean())
