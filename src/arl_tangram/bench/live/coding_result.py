"""Shell: the live coding workload's outcome: its ``--json`` summary (gains against the
better baseline, reward correctness) and the distribution parameters the simulator check
describes it by (means, spreads, fractions; never per-action durations).

Pure: called by ``coding.run_async`` with every system's ``SystemRun`` and trajectories.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from arl_tangram.bench.live.coding_ceiling import reachable
from arl_tangram.bench.live.coding_plan import Calibration, CodingConfig, Problem
from arl_tangram.bench.live.coding_queue import queue_anatomy
from arl_tangram.bench.live.coding_records import ActionRecord, TrajectoryOutcome
from arl_tangram.bench.live.common import SystemRun, WorkloadResult

TANGRAM = "tangram"


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _log_sigma(values: Sequence[float]) -> float:
    """The spread ``sigma`` of the lognormal with the same mean and variance as ``values``
    (moments, not log-space fitting: test runs are bimodal, fast failures and full passes,
    and queueing depends on the second moment, which a log-space fit overstates); 0 for
    fewer than two values."""
    positive = [v for v in values if v > 0]
    if len(positive) < 2:
        return 0.0
    mean = statistics.fmean(positive)
    return math.sqrt(math.log1p(statistics.pvariance(positive) / (mean * mean)))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _add_extras(run: SystemRun, outcomes: list[TrajectoryOutcome]) -> None:
    actions = [a for o in outcomes for a in o.actions]
    env = [a.act_s for a in actions if a.category == "env"]
    reward = [a.act_s for a in actions if a.category == "reward"]
    life_s = sum(o.ended_s - o.started_s for o in outcomes)
    run.extra.update(
        mean_env_act_s=_mean(env),
        mean_reward_act_s=_mean(reward),
        rewards_correct=_ratio(sum(o.correct for o in outcomes), len(outcomes)),
        actions_lost=float(sum(o.lost for o in outcomes)),
        num_actions=float(len(actions)),
        env_busy_fraction=_ratio(sum(env), life_s),
        mean_trajectory_s=_ratio(life_s, len(outcomes)),
    )


def workload_result(
    runs: dict[str, tuple[SystemRun, list[TrajectoryOutcome]]], config: CodingConfig, problems: list[Problem],
    cores: int, calibration: Calibration,
) -> WorkloadResult:  # fmt: skip
    """The workload's result; ``calibration`` set the think time and the tests' declared curve."""
    for run, outcomes in runs.values():
        _add_extras(run, outcomes)
    systems = [r for r, _ in runs.values()]
    summary = _summary(runs, config, cores, calibration)
    summary["parameters"] = {**config.describe(cores, calibration.turn_core_s), "calibration": asdict(calibration)}
    return WorkloadResult("coding", systems, summary, _fitted(runs, config, problems, cores, calibration))


def _summary(
    runs: dict[str, tuple[SystemRun, list[TrajectoryOutcome]]], config: CodingConfig, cores: int, calibration: Calibration
) -> dict[str, Any]:
    tangram = runs[TANGRAM][0] if TANGRAM in runs else None
    baselines = [r for name, (r, _) in runs.items() if name != TANGRAM]
    all_outcomes = [o for _, outs in runs.values() for o in outs]
    scores = [(v, s) for o in all_outcomes for v, s in o.scores]
    summary: dict[str, Any] = {
        "rewards_correct": _ratio(sum(o.correct for o in all_outcomes), len(all_outcomes)),
        "actions_lost": sum(o.lost for o in all_outcomes),
        "trajectories_finished": sum(o.ended_s > 0 for o in all_outcomes),
        "trajectories": len(all_outcomes),
        "minilm_score_mean": _mean([s for _, s in scores]),  # the final solutions' similarity to the canonical one
        "num_trajectories": config.num_trajectories,
        "pool_cores": cores,
        "pod_millicores": config.pod_millicores(cores),
        "mean_act_s": {r.system: r.mean_act_s for r, _ in runs.values()},
        "step_s": {r.system: r.step_s for r, _ in runs.values()},
        "per_system": {r.system: dict(r.extra) for r, _ in runs.values()},
    }
    if tangram is not None and baselines:
        best_act = min(baselines, key=lambda r: r.mean_act_s)
        best_step = min(baselines, key=lambda r: r.step_s)
        summary.update(
            act_gain=_ratio(best_act.mean_act_s, tangram.mean_act_s),
            step_gain=_ratio(best_step.step_s, tangram.step_s),
            best_baseline=best_act.system,
            act_gain_vs={r.system: _ratio(r.mean_act_s, tangram.mean_act_s) for r in baselines},
            step_gain_vs={r.system: _ratio(r.step_s, tangram.step_s) for r in baselines},
            env_act_gain=_ratio(best_act.extra["mean_env_act_s"], tangram.extra["mean_env_act_s"]),
            reward_act_gain=_ratio(best_act.extra["mean_reward_act_s"], tangram.extra["mean_reward_act_s"]),
        )
        outcomes, s = runs[TANGRAM][1], calibration.serial_fraction
        ideal_s, ideal_step = ideal_mean_act_s(outcomes, s, cores), ideal_step_s(outcomes, config.num_trajectories, s, cores)
        summary.update(ideal_mean_act_s=ideal_s, act_gain_ceiling=_ratio(best_act.mean_act_s, ideal_s),
                       ideal_step_s=ideal_step, step_gain_ceiling=_ratio(best_step.step_s, ideal_step))  # fmt: skip
        reach = reachable(outcomes, s, cores)  # ``coding_ceiling``: the bound of whole runs, a clairvoyant SRPT
        if reach:
            env_s = best_act.extra["mean_env_act_s"]
            summary.update(
                reach,
                act_gain_ceiling_whole_runs=_ratio(best_act.mean_act_s, reach["bound_mean_act_s"]),
                env_act_gain_ceiling_whole_runs=_ratio(env_s, reach["bound_env_mean_act_s"]),
                act_gain_srpt_replay=_ratio(best_act.mean_act_s, reach["srpt_replay_mean_act_s"]),
                env_act_gain_srpt_replay=_ratio(env_s, reach["srpt_replay_env_mean_act_s"]),
            )
        anatomy = queue_anatomy(outcomes, cores, len(tangram.act_s))  # ``coding_queue``: what the env actions waited behind
        if anatomy:
            lints_pass_s = tangram.mean_act_s - anatomy["lint_queue_per_action_s"]
            summary.update(queue_anatomy=anatomy, act_gain_lints_never_behind_tests=_ratio(best_act.mean_act_s, lints_pass_s))
    return summary


def ideal_act_s(action: ActionRecord, serial_fraction: float, cores: int) -> float:
    """An action's ACT had it the whole pool to itself: no queue, a test run at DoP
    ``cores`` on the calibrated curve (its measured run rescaled from the DoP it got), any
    other action as measured; the platform's overhead kept."""

    def amdahl(m: int) -> float:
        return serial_fraction + (1 - serial_fraction) / max(1, m)

    exec_s = action.result.exec_s
    if action.kind == "test":
        exec_s *= amdahl(cores) / amdahl(int(action.result.dop or 1))
    return exec_s + action.result.overhead_s


def ideal_mean_act_s(outcomes: list[TrajectoryOutcome], serial_fraction: float, cores: int) -> float:
    """Mean ``ideal_act_s`` over the run: no allocation of these cores does better, so
    best baseline / this is the most any scheduler could gain here."""
    return _mean([ideal_act_s(a, serial_fraction, cores) for o in outcomes for a in o.actions])


def ideal_step_s(outcomes: list[TrajectoryOutcome], batch: int, serial_fraction: float, cores: int) -> float:
    """Mean step time had every action its ``ideal_act_s``: per step (``outcomes`` holds
    the steps' batches in order) the longest trajectory's thinks plus its ideal ACTs."""
    steps = [outcomes[i : i + batch] for i in range(0, len(outcomes), max(1, batch))]
    return _mean([
        max(o.ended_s - o.started_s - sum(a.act_s for a in o.actions) + sum(ideal_act_s(a, serial_fraction, cores) for a in o.actions) for o in step)
        for step in steps if step
    ])  # fmt: skip


def _fitted(
    runs: dict[str, tuple[SystemRun, list[TrajectoryOutcome]]], config: CodingConfig, problems: list[Problem],
    cores: int, calibration: Calibration,
) -> dict[str, Any]:  # fmt: skip
    """The coding workload as distribution parameters, measured on the ARL-Tangram run
    (exclusive grants, so execution times are the actions' own), for ``sim.workloads.coding``.
    The tests' serial fraction is the calibration's (measured alone on the pool, and the
    curve the live tests declared), not one fitted from in-run times that host load skews."""
    outcomes = runs[TANGRAM][1] if TANGRAM in runs else next(iter(runs.values()))[1]
    actions = [a for o in outcomes for a in o.actions]
    lints = [a for a in actions if a.kind == "lint"]
    tests = [a for a in actions if a.kind == "test"]
    rewards = [a for a in actions if a.category == "reward"]
    s = calibration.serial_fraction
    # a run's work on one core: T(m) = T1 (s + (1 - s) / m)  =>  T1 = T(m) / (s + (1 - s) / m)
    t_ori = {a.result.action_id: a.result.exec_s / (s + (1 - s) / max(1, a.result.dop or 1)) for a in tests}
    # failing runs stop at their first failed check: a second, short mode, fitted apart so
    # the spread is each mode's own (one lognormal over both invents a long tail of slow runs)
    passed = [t_ori[a.result.action_id] for a in tests if a.result.outcome == "succeeded"]
    failed = [t_ori[a.result.action_id] for a in tests if a.result.outcome != "succeeded"]
    env_actions = [len([a for a in o.actions if a.category == "env"]) for o in outcomes]
    think_turn_s = config.think_mean_s(cores, calibration.turn_core_s)
    reward_s = [sum(a.result.exec_s for a in o.actions if a.category == "reward") for o in outcomes]
    env_start = [o.env_start_s for o in outcomes]
    mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        # sim.workloads.coding.CodingParams, by field name
        "batch": config.num_trajectories,  # one step's (the outcomes pool every step's)
        "turns_min": min(env_actions, default=0),
        "turns_max": max(env_actions, default=0),
        "think_mean_s": think_turn_s / 2,  # before each action, as the plans draw it
        "think_sigma": config.think_sigma,
        "command_mean_s": _mean([a.result.exec_s for a in lints]),
        "test_fraction": _ratio(len(tests), len(tests) + len(lints)),
        "test_t_ori_mean_s": _mean(passed),
        # the live shape: 1 or 2 attempts (lint, then tests), a broken first attempt failing
        "attempts_max": max((len(o.verdicts) for o in outcomes), default=1),
        "retry_fraction": _ratio(sum(len(o.verdicts) > 1 for o in outcomes), len(outcomes)),
        "test_fail_t_ori_mean_s": _mean(failed),
        "test_serial_fraction": s,
        "serial_sigma": 0.0,
        "test_dop_max": cores,
        "reward_t_ori_mean_s": _mean(reward_s),  # live: MiniLM scoring (CPU device), summed per trajectory
        "env_mem_bytes": _env_mem_bytes(config),
        "sigma": _log_sigma(passed),
        # the platform (sim.platform.Platform) and the cluster
        "action_overhead_s": _mean([a.result.overhead_s for a in actions if a.category == "env"]),
        "env_start_min_s": min(env_start, default=0.0),
        "env_start_max_s": max(env_start, default=0.0),
        "cores": cores,
        "gpu_devices": 1,
        "cluster": {"cpu_nodes": 1, "cores": cores, "mem_bytes": mem_bytes, "gpu_devices": 1},
        # more of the live shape, for the report
        "env_actions_mean": _mean(env_actions),
        "think_per_turn_mean_s": think_turn_s,
        "command_sigma": _log_sigma([a.result.exec_s for a in lints]),
        "test_pass_fraction": _ratio(sum(a.result.outcome == "succeeded" for a in tests), len(tests)),
        "test_dop_mean": _mean([float(a.result.dop or 1) for a in tests]),
        "reward_mean_s": _mean([a.result.exec_s for a in rewards]),
        "reward_sigma": _log_sigma([a.result.exec_s for a in rewards]),
        "reward_overhead_mean_s": _mean([a.result.overhead_s for a in rewards]),
        "pod_millicores": config.pod_millicores(cores),
        "problems": [p.task_id for p in problems],
    }


def _env_mem_bytes(config: CodingConfig) -> int:
    from arl_tangram.runtime.config import parse_size_bytes

    return parse_size_bytes(config.env_mem, "env_mem")
