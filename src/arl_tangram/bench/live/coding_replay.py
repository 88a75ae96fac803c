"""Shell: the live coding run's reachable ACT, replayed with a clairvoyant scheduler.

Why: ``act_gain_ceiling`` (``coding_result.ideal_mean_act_s``) prices every action as if
it ran alone, with no queue; on this workload's bursts (32 trajectories that start
together on a 2-core pool) no scheduler gets near it. This replay answers the sharper
question: what mean ACT would the tangram run's own env actions have had under preemptive
shortest-remaining-first with every run's length known in advance
(``sim.srpt_replay``), on the run's arrivals and measured single-core run times? It is a
reference for schedulers of exclusive single-core grants (what tangram grants here), not a
bound on every schedule: elastic DoP could in principle beat it, and a closed loop would
shift later arrivals.

Pure: reads the tangram run's ``TrajectoryOutcome``s. Per env action: arrival = its
submission (a trajectory's first action after the env start-up wait it was charged),
size = its measured execution at one core (a test run at DoP ``m`` rescaled along the
calibrated Amdahl curve), plus its measured overhead and that start-up wait, as measured.
Reward calls are served by the shared reward service, not the pool's cores: they keep
their measured ACT.
"""

from __future__ import annotations

import statistics

from arl_tangram.bench.live.coding_records import TrajectoryOutcome
from arl_tangram.sim.srpt_replay import srpt_flow_times


def _at_one_core(exec_s: float, dop: int, serial_fraction: float) -> float:
    """A run measured at DoP ``dop`` rescaled to one core on Amdahl's curve."""
    return exec_s / (serial_fraction + (1 - serial_fraction) / max(1, dop))


def srpt_replay(outcomes: list[TrajectoryOutcome], serial_fraction: float, cores: int) -> dict[str, float]:
    """``srpt_replay_mean_act_s`` (every action) and ``srpt_replay_env_mean_act_s`` (env
    actions) of the replay described in the module doc; {} for a run without env actions."""
    arrivals: list[float] = []
    sizes: list[float] = []
    fixed: list[float] = []  # what the replay does not schedule: overhead and start-up wait
    rewards: list[float] = []
    for o in outcomes:
        for index, a in enumerate(o.actions):
            if a.category != "env":
                rewards.append(a.act_s)
                continue
            waited = o.env_wait_s if index == 0 else 0.0  # ``coding._action`` moved its submission back by it
            size = a.result.exec_s
            if a.kind == "test":
                size = _at_one_core(size, int(a.result.dop or 1), serial_fraction)
            arrivals.append(a.submitted_s + waited)
            sizes.append(max(0.0, size))
            fixed.append(a.result.overhead_s + waited)
    if not arrivals:
        return {}
    env = [f + x for f, x in zip(srpt_flow_times(arrivals, sizes, cores), fixed, strict=True)]
    return {"srpt_replay_mean_act_s": statistics.fmean(env + rewards), "srpt_replay_env_mean_act_s": statistics.fmean(env)}
