"""Shell: where the live coding run's env actions waited, by what held the pool's cores
when they arrived.

Why: the coding ACT gain against Burstable pods turns on queue time (tangram's runs are
faster than the pods' once started, then wait for a core). Which queue it is decides
which mechanism could help: a lint waiting behind test runs is what letting short actions
pass long ones (preemption, sharing a core) removes; a test run waiting behind two other
test runs on a 2-core pool is capacity, which an order or a pause only moves between runs
of about the same size.

Pure: reads the tangram run's ``TrajectoryOutcome``s. An action's wait is its scheduler
queue time (a trajectory's first action also carries the env start-up wait it was charged,
reported apart as ``env_start``). At its submission the running env actions are those
started before and not yet ended; "behind tests" means they were all test runs holding
every core of the pool (DoPs summing to ``cores`` or more).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arl_tangram.bench.live.coding_records import TrajectoryOutcome

CAUSES = ("test_behind_tests", "lint_behind_tests", "other")


@dataclass(frozen=True)
class _Run:
    kind: str
    arrived_s: float
    started_s: float
    ended_s: float
    dop: int
    waited_s: float  # scheduler queue time, the env start-up wait taken out


def _env_runs(outcomes: list[TrajectoryOutcome]) -> tuple[list[_Run], float]:
    """The env actions as runs, and the env start-up wait charged to first actions."""
    runs, env_start_s = [], 0.0
    for o in outcomes:
        for a, extra in o.with_env_wait():
            if a.category != "env":
                continue
            started = a.submitted_s + a.result.queue_s
            ended = started + a.result.exec_s + a.result.overhead_s
            runs.append(_Run(a.kind, a.submitted_s + extra, started, ended, int(a.result.dop or 1), max(0.0, a.result.queue_s - extra)))
            env_start_s += extra
    return runs, env_start_s


def _cause(run: _Run, runs: list[_Run], cores: int) -> str:
    holding = [r for r in runs if r is not run and r.started_s <= run.arrived_s < r.ended_s]
    if holding and all(r.kind == "test" for r in holding) and sum(r.dop for r in holding) >= cores:
        return f"{run.kind}_behind_tests" if run.kind in ("test", "lint") else "other"
    return "other"


def queue_anatomy(outcomes: list[TrajectoryOutcome], cores: int, num_actions: int) -> dict[str, Any]:
    """``env_queue_share``: each cause's share of the env actions' scheduler queue time (the
    shares sum to 1 when anything waited); ``env_queue_mean_s``: that time per env action;
    ``env_start_wait_mean_s``: the env start-up wait per env action, apart;
    ``lint_queue_per_action_s``: the lints' wait behind tests spread over all
    ``num_actions`` actions (env and reward): the most any way of letting lints pass test
    runs could take off the mean ACT, before the lints' and the tests' slowdown from
    sharing. {} for a run without env actions."""
    runs, env_start_s = _env_runs(outcomes)
    if not runs:
        return {}
    waited = dict.fromkeys(CAUSES, 0.0)
    for run in runs:
        if run.waited_s > 0:
            waited[_cause(run, runs, cores)] += run.waited_s
    total = sum(waited.values())
    return {
        "env_queue_mean_s": total / len(runs),
        "env_start_wait_mean_s": env_start_s / len(runs),
        "env_queue_share": {cause: (s / total if total > 0 else 0.0) for cause, s in waited.items()},
        "lint_queue_per_action_s": waited["lint_behind_tests"] / max(1, num_actions),
    }
