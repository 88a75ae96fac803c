"""Shell: how much the live coding run's ACT could have gained at best, on its own arrivals.

Why: ``act_gain_ceiling`` (``coding_result.ideal_mean_act_s``) prices every action as if
it ran alone, with no queue; on this workload's bursts (32 trajectories that start
together on a 2-core pool) no scheduler gets near it. Two sharper references, from the
tangram run's env actions (its arrivals and measured run times):

- ``bound_mean_act_s`` (``sim.bound.capacity_bound``): a proven lower bound on the mean ACT
  of every schedule that runs each action whole, at one DoP, on cores of its own (no
  preemption, no sharing: what tangram's grants are here, its preemption being off), on
  the calibrated curve for test runs, with the pool's ``cores`` kept;
- ``srpt_replay_mean_act_s`` (``sim.srpt_replay``): preemptive shortest-remaining-first with
  every run's length known in advance, each on one core. A reference for preemptive (and
  sharing) schedulers of single-core runs, not a bound (SRPT is near-optimal on several
  cores, not optimal; elastic DoP could in principle beat it).

Caveats, said plainly: measured run times carry this host's contention; a closed loop
would shift later arrivals; the bound takes the run's smallest overhead for every action.

Pure: reads the tangram run's ``TrajectoryOutcome``s. Per env action: arrival = its
submission (a trajectory's first action after the env start-up wait it was charged, which
is added back to its ACT), size = its measured execution (a test run at DoP ``m`` rescaled
to one core along the calibrated Amdahl curve). Reward calls are served by the shared
reward service, not the pool's cores: they keep their measured ACT.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from arl_tangram.bench.live.coding_records import TrajectoryOutcome
from arl_tangram.core.elasticity import Amdahl
from arl_tangram.sim.bound import BoundInstance, amdahl_row, capacity_bound
from arl_tangram.sim.srpt_replay import srpt_flow_times

# The bound's resolution: the runs last 0.02-0.4 s, so 0.5-s bins (the SWE workload's) leave
# it near the no-queue ideal; at 0.02-s bins with a larger step it was within 0.5% of the
# best schedule found offline on a full run's trace, in about half a second. Any setting
# gives a valid bound; these only make it tighter.
BIN_S = 0.02
WINDOW_BINS = 100
ITERATIONS = 600
STEP = 0.05


@dataclass(frozen=True)
class _Env:
    arrivals: list[float]
    rows: list[list[float]]  # run time at DoP 1..m (only DoP 1 for a lint); row[0] at one core
    waited: list[float]  # env start-up wait charged to the action
    overheads: list[float]
    rewards: list[float]  # reward ACTs, as measured


def _env_actions(outcomes: list[TrajectoryOutcome], serial_fraction: float, cores: int) -> _Env:
    env = _Env([], [], [], [], [])
    curve = Amdahl(serial_fraction)
    for o in outcomes:
        for a, waited in o.with_env_wait():
            if a.category != "env":
                env.rewards.append(a.act_s)
                continue
            exec_s = max(0.0, a.result.exec_s)
            if a.kind == "test":  # rescaled to one core from the DoP it ran at
                env.rows.append(amdahl_row(exec_s * curve.speedup(int(a.result.dop or 1)), serial_fraction, 1, cores))
            else:
                env.rows.append([exec_s])
            env.arrivals.append(a.submitted_s + waited)
            env.waited.append(waited)
            env.overheads.append(a.result.overhead_s)
    return env


def reachable(outcomes: list[TrajectoryOutcome], serial_fraction: float, cores: int) -> dict[str, float]:
    """The references of the module doc, over every action (``*_mean_act_s``) and over env
    actions (``*_env_mean_act_s``); {} for a run without env actions."""
    env = _env_actions(outcomes, serial_fraction, cores)
    if not env.arrivals:
        return {}
    replay = [f + o + w for f, o, w in zip(srpt_flow_times(env.arrivals, [row[0] for row in env.rows], cores), env.overheads, env.waited, strict=True)]
    inst = BoundInstance.of(env.arrivals, env.rows, max(1, cores), max(0.0, min(env.overheads)))
    bound = capacity_bound(inst, bin_s=BIN_S, iterations=ITERATIONS, window_bins=WINDOW_BINS, step=STEP)
    bound_env_s = bound.mean_s + statistics.fmean(env.waited)
    n = len(env.arrivals) + len(env.rewards)
    return {
        "bound_env_mean_act_s": bound_env_s,
        "bound_mean_act_s": (bound_env_s * len(env.arrivals) + sum(env.rewards)) / n,
        "srpt_replay_env_mean_act_s": statistics.fmean(replay),
        "srpt_replay_mean_act_s": (sum(replay) + sum(env.rewards)) / n,
    }
