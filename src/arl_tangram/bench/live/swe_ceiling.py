"""Shell: the SWE workload's ACT ceiling on this pool: the lowest mean ACT any allocation of
its cores could give the live tangram run's actions, so ``act_gain_ceiling`` (best pod
system's mean ACT over it) says how much of the issue's 2x target the hardware leaves.

Pure: a capacity-respecting lower bound (``sim.bound.capacity_bound``: every action keeps
the arrival it had and the duration it was measured to run; the pool's ``cores`` bound what
runs at once; the elastic suite may take any DoP on its declared Amdahl curve). Two figures:
``ideal_mean_act_s`` (no capacity limit: each action as if alone, the coding workload's
ceiling) and ``bound_mean_act_s`` (with the capacity kept). Caveats, said plainly: measured
durations carry this host's contention; the bound keeps the run's own arrivals (a closed
loop would shift them); it relaxes everything but cores (memory, env affinity), so it holds.
"""

from __future__ import annotations

from arl_tangram.bench.live.swe_plan import ACT_KINDS
from arl_tangram.bench.live.swe_rollout import RolloutOutcome
from arl_tangram.sim.bound import BoundInstance, capacity_bound

SERIAL_FRACTION = 0.1  # the curve the rollouts declare for the suite (swe_rollout: Elastic(serial_fraction=0.1))
WINDOW_BINS = 48  # start delays the bound evaluates exactly: 24 s at 0.5 s bins (beyond, a start costs its delay)
ITERATIONS = 200  # subgradient steps: a tighter (still valid) bound than the default 60, in tens of ms here


def _amdahl(m: int) -> float:
    return SERIAL_FRACTION + (1 - SERIAL_FRACTION) / max(1, m)


def instance(outcomes: list[RolloutOutcome], cores: int) -> BoundInstance:
    """The run's ACT-kind actions: arrival = submission, T(1) = measured execution (the
    suite's rescaled from the DoP it got along the declared curve), the smallest overhead
    the run measured before every start."""
    acts = [a for o in outcomes for a in o.actions if a.kind in ACT_KINDS]
    rows: list[list[float]] = []
    for a in acts:
        exec_s = max(a.result.exec_s, 1e-6)
        if a.kind == "test":
            at_one = exec_s / _amdahl(int(a.result.dop or 1))
            rows.append([at_one * _amdahl(m) for m in range(1, cores + 1)])
        else:
            rows.append([exec_s])
    overhead_s = min((a.result.overhead_s for a in acts), default=0.0)
    return BoundInstance.of([a.submitted_s for a in acts], rows or [[0.0]], max(1, cores), max(0.0, overhead_s))


def ceiling(outcomes: list[RolloutOutcome], cores: int, baseline_mean_act_s: float) -> dict[str, float]:
    """``ideal_mean_act_s``, ``bound_mean_act_s`` and the gains over them a perfect
    scheduler could reach against the baseline (``act_gain_ceiling`` uses the bound)."""
    if not any(o.actions for o in outcomes):
        return {}
    b = capacity_bound(instance(outcomes, cores), iterations=ITERATIONS, window_bins=WINDOW_BINS)
    return {
        "ideal_mean_act_s": b.ideal_mean_s,
        "bound_mean_act_s": b.mean_s,
        "act_gain_ceiling": baseline_mean_act_s / b.mean_s if b.mean_s > 0 else 0.0,
        "act_gain_ceiling_uncapped": baseline_mean_act_s / b.ideal_mean_s if b.ideal_mean_s > 0 else 0.0,
    }
