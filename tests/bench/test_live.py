"""``arl-tangram bench live``: the coding workload's correctness (not its speed) on real
sandboxes and the real MiniLM reward service, its sandbox test runner, and the report.

Every trajectory of every system finishes, every test verdict matches the solution's known
correctness (canonical passes, broken fails), no action is lost, and nothing is left
running (the suite's ``no_leftovers`` fixture checks processes, cgroups, mounts, temp dirs).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arl_tangram.bench import live
from arl_tangram.bench.live import coding, coding_runner
from arl_tangram.bench.live.coding_ceiling import reachable
from arl_tangram.bench.live.coding_plan import (
    Calibration,
    CodingConfig,
    Problem,
    TrajectoryPlan,
    make_plans,
)
from arl_tangram.bench.live.coding_queue import queue_anatomy
from arl_tangram.bench.live.coding_result import ideal_mean_act_s, ideal_step_s
from arl_tangram.bench.live.common import Progress, SystemRun, WorkloadResult
from arl_tangram.bench.live.headline import headline
from arl_tangram.bench.live.report import _cores_over_time, quantile
from arl_tangram.runtime.actions import ActionResult
from tests.managers.cpu.conftest import needs_root

ADD = Problem(
    "toy/add", 'def add(a, b):\n    """Sum of a and b."""\n', "    return a + b\n",
    "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n", "add", reps=101,
)  # fmt: skip


def _run_runner(tmp_path: Path, variant: str, dop: int) -> tuple[int, dict]:
    (tmp_path / "problem.json").write_text(json.dumps({"test": ADD.test, "entry_point": ADD.entry_point, "reps": ADD.reps}))
    (tmp_path / "sol.py").write_text(ADD.solution(variant))
    proc = subprocess.run(
        [sys.executable, coding_runner.__file__, "problem.json", "sol.py"], cwd=tmp_path, capture_output=True,
        text=True, timeout=60, env={**os.environ, "TANGRAM_DOP": str(dop)},
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dop", [1, 3])
def test_the_runner_splits_repeated_checks_over_the_dop_and_gives_verdicts(tmp_path: Path, dop: int) -> None:
    code, report = _run_runner(tmp_path, "canonical", dop)
    assert (code, report["passed"], report["reps_run"], report["workers"]) == (0, True, ADD.reps, dop)
    for broken in ("wrong_value", "raises"):
        code, report = _run_runner(tmp_path, broken, dop)
        assert code == 1 and not report["passed"] and report["error"], report


def test_plans_are_seeded_and_half_the_first_attempts_are_broken() -> None:
    config = CodingConfig(num_trajectories=8, seed=3)
    plans = make_plans(config, [ADD], pool_cores=2)
    assert plans == make_plans(config, [ADD], pool_cores=2)
    assert sum(p.first_variant != "canonical" for p in plans) == 4
    assert all(len(p.think_s) == 5 and min(p.think_s) > 0 for p in plans)
    assert config.pod_millicores(2) == 250  # pool cores / batch, in millicores


def test_calibration_reads_the_serial_fraction_off_two_run_times() -> None:
    assert Calibration.serial_from(1.0, 0.5, 2) == 0.0  # halves on two cores: all parallel
    assert Calibration.serial_from(1.0, 0.75, 2) == 0.5
    assert Calibration.serial_from(1.0, 1.0, 4) == 1.0  # no faster: all serial
    assert Calibration.serial_from(1.0, 1.3, 2) == 1.0 and Calibration.serial_from(1.0, 0.1, 2) == 0.0  # noise clamps
    assert Calibration.serial_from(1.0, 0.5, 1) == 1.0  # one core says nothing


def test_the_ideal_gives_each_test_run_the_whole_pool_and_nothing_a_queue() -> None:
    def record(kind: str, dop: int, exec_s: float) -> coding.ActionRecord:
        result = ActionResult("a", kind, "succeeded", queue_s=5.0, exec_s=exec_s, overhead_s=0.01, dop=dop)
        return coding.ActionRecord("env", kind, 0.0, result)

    outcome = coding.TrajectoryOutcome(TrajectoryPlan(0, "toy/add", "canonical", (1.0,) * 5), 0.0)
    outcome.actions += [record("lint", 1, 0.1), record("test", 1, 1.0), record("test", 2, 0.75)]
    # s = 0.5 on 2 cores: a DoP-1 run of 1.0 s takes 0.75 s; the DoP-2 run is already there
    assert ideal_mean_act_s([outcome], serial_fraction=0.5, cores=2) == pytest.approx((0.1 + 0.75 + 0.75) / 3 + 0.01)
    # a step: the trajectory's life less its ACTs (3 x 5.01 s queued) plus the ideal ones
    outcome.ended_s = 20.0
    assert ideal_step_s([outcome, outcome], 1, 0.5, 2) == pytest.approx(20.0 - (5.11 + 6.01 + 5.76) + (0.11 + 0.76 + 0.76))


def test_the_references_keep_the_pools_cores_srpt_preempts_and_whole_runs_queue() -> None:
    def record(category: str, kind: str, submitted_s: float, exec_s: float, dop: int = 1, queue_s: float = 0.0) -> coding.ActionRecord:
        result = ActionResult("a", kind, "succeeded", queue_s=queue_s, exec_s=exec_s, overhead_s=0.01, dop=dop)
        return coding.ActionRecord(category, kind, submitted_s, result)

    first = coding.TrajectoryOutcome(TrajectoryPlan(0, "toy/add", "canonical", (1.0,) * 5), 0.0)
    first.env_wait_s = 0.5  # its first action was charged 0.5 s of env start-up and moved back by it
    first.actions += [record("env", "test", -0.5, 0.75, dop=2, queue_s=0.5), record("reward", "reward", 9.0, 0.2, queue_s=0.3)]
    second = coding.TrajectoryOutcome(TrajectoryPlan(1, "toy/add", "canonical", (1.0,) * 5), 0.0)
    second.actions += [record("env", "lint", 0.5, 0.25)]
    # one core, s = 0.5: the test (1.0 s at one core) arrives at 0; the lint arrives at 0.5.
    # SRPT: the lint preempts the test and ends at 0.75, the test at 1.25
    out = reachable([first, second], serial_fraction=0.5, cores=1)
    test_act, lint_act, reward_act = 1.25 + 0.01 + 0.5, 0.25 + 0.01, 0.5 + 0.01
    assert out["srpt_replay_env_mean_act_s"] == pytest.approx((test_act + lint_act) / 2)
    assert out["srpt_replay_mean_act_s"] == pytest.approx((test_act + lint_act + reward_act) / 3)
    # whole runs: at best the test runs 0-1 and the lint 1-1.25 (flows 1.0 and 0.75); with no
    # core limit they would be 1.0 and 0.25; the bound lies between (plus overhead and wait)
    best_s, ideal_s = (1.0 + 0.75) / 2 + 0.01 + 0.25, (1.0 + 0.25) / 2 + 0.01 + 0.25
    assert ideal_s + 0.05 < out["bound_env_mean_act_s"] <= best_s + 1e-9
    assert out["bound_mean_act_s"] == pytest.approx((out["bound_env_mean_act_s"] * 2 + reward_act) / 3)
    assert reachable([], 0.5, 1) == {}


def test_queue_anatomy_names_what_held_the_cores_when_each_action_arrived() -> None:
    def record(kind: str, submitted_s: float, queue_s: float, exec_s: float, dop: int = 1) -> coding.ActionRecord:
        result = ActionResult("a", kind, "succeeded", queue_s=queue_s, exec_s=exec_s, overhead_s=0.0, dop=dop)
        return coding.ActionRecord("env", kind, submitted_s, result)

    def trajectory(n: int, *actions: coding.ActionRecord, env_wait_s: float = 0.0) -> coding.TrajectoryOutcome:
        out = coding.TrajectoryOutcome(TrajectoryPlan(n, "toy/add", "canonical", (1.0,) * 5), 0.0)
        out.env_wait_s = env_wait_s
        out.actions += actions
        return out

    # two cores: two tests hold both from 0 to 1; a third test (arrived 0.1, after 0.3 s of
    # env start-up it was charged and moved back by) and a lint (0.2) wait for them; a lint at
    # 1.95 waits 0.1 behind a single test of DoP 1 (not "behind tests": a core was free)
    outcomes = [
        trajectory(0, record("test", 0.0, 0.0, 1.0), record("lint", 1.95, 0.1, 0.1)),
        trajectory(1, record("test", 0.0, 0.0, 1.0)),
        trajectory(2, record("test", -0.2, 0.3 + 0.9, 1.0), env_wait_s=0.3),
        trajectory(3, record("lint", 0.2, 0.8, 0.1), record("test", 1.4, 0.0, 0.5)),
    ]
    out = queue_anatomy(outcomes, cores=2, num_actions=8)
    waited = 0.9 + 0.8 + 0.1
    assert out["env_queue_share"] == pytest.approx({"test_behind_tests": 0.9 / waited, "lint_behind_tests": 0.8 / waited, "other": 0.1 / waited})
    assert out["env_queue_mean_s"] == pytest.approx(waited / 6) and out["env_start_wait_mean_s"] == pytest.approx(0.3 / 6)
    assert out["lint_queue_per_action_s"] == pytest.approx(0.8 / 8)
    # one test at DoP 2 holds both cores too; at DoP 1 on two cores it does not
    wide = [trajectory(0, record("test", 0.0, 0.0, 1.0, dop=2)), trajectory(1, record("lint", 0.5, 0.5, 0.1))]
    assert queue_anatomy(wide, cores=2, num_actions=2)["env_queue_share"]["lint_behind_tests"] == 1.0
    assert queue_anatomy(wide, cores=3, num_actions=2)["env_queue_share"]["other"] == 1.0
    assert queue_anatomy([], cores=2, num_actions=0) == {}


def test_the_headline_says_what_the_coding_queue_waited_behind_when_coding_does_not_win() -> None:
    summary = {"act_gain": 0.96, "step_gain": 1.0, "act_gain_ceiling": 1.5, "best_baseline": "k8s-burstable", "act_gain_lints_never_behind_tests": 1.04,
               "queue_anatomy": {"env_queue_share": {"test_behind_tests": 0.6, "lint_behind_tests": 0.25, "other": 0.15}}}  # fmt: skip
    text = headline([WorkloadResult("coding", [], summary, {})])
    assert "60% was test runs waiting" in text and "25% lints waiting behind tests" in text and "at most 1.04x" in text
    assert "lints waiting" not in headline([WorkloadResult("coding", [], dict(summary, act_gain=1.3), {})])  # a win says no more


def test_report_quantiles_and_cores_over_time() -> None:
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0 and quantile([1.0, 2.0], 0.99) == 2.0
    assert math.isnan(quantile([], 0.5))
    held = _cores_over_time([(0.0, 2.0, 1.0), (1.0, 2.0, 1.0)], end_s=2.0, step_s=1.0, rate=False)
    assert held == [1.0, 2.0, 0.0]
    used = _cores_over_time([(0.0, 2.0, 1.0)], end_s=2.0, step_s=1.0, rate=True)  # 1 core-s over 2 s
    assert used == [0.5, 0.5, 0.0]


@needs_root
def test_coding_on_every_system_finishes_every_trajectory_with_right_verdicts() -> None:
    config = CodingConfig(num_trajectories=4, num_problems=3, test_work_s=0.05, steps=2, calibration_problems=2, seed=1)
    result = asyncio.run(coding.run_async(config, Progress(min_interval_s=5.0)))
    s = result.summary
    assert [r.system for r in result.runs] == list(coding.SYSTEMS)
    assert s["trajectories_finished"] == s["trajectories"] == 4 * len(coding.SYSTEMS) * 2  # every step's batch
    assert all(len(each) == 2 and min(each) > 0 for each in s["step_s_each"].values())
    assert s["parameters"]["calibration"]["samples"] == 2 and 0 <= s["parameters"]["calibration"]["serial_fraction"] <= 1
    assert s["rewards_correct"] == 1.0 and s["actions_lost"] == 0, s
    assert s["minilm_score_mean"] > 0.99  # every final solution is the canonical one
    # every action is accounted for: per turn a lint and a test (half the first attempts are
    # broken and retried: 4 + 2 turns), and one score per trajectory, in each of 2 steps
    for run in result.runs:
        assert isinstance(run, SystemRun) and len(run.act_s) == 2 * (2 * (4 + 2) + 4), run.system
        assert all(a >= 0 for a in run.act_s) and run.core_s_used > 0 and run.reserved_spans
    assert {"act_gain", "step_gain", "best_baseline"} <= set(s)
    assert result.fitted["batch"] == 4 and result.fitted["cores"] >= 1
    assert (result.fitted["attempts_max"], result.fitted["retry_fraction"]) == (2, 0.5)  # the live shape, for the simulator
    assert s["ideal_mean_act_s"] > 0 and s["act_gain_ceiling"] > 0 and 0 < s["ideal_step_s"] <= s["step_s"]["tangram"]
    assert s["ideal_mean_act_s"] <= s["srpt_replay_mean_act_s"] and s["act_gain_srpt_replay"] <= s["act_gain_ceiling"]
    assert s["ideal_mean_act_s"] <= s["bound_mean_act_s"] and s["act_gain_ceiling_whole_runs"] <= s["act_gain_ceiling"]
    assert sum(s["queue_anatomy"]["env_queue_share"].values()) in (0.0, pytest.approx(1.0))
    assert s["act_gain_lints_never_behind_tests"] >= s["act_gain"]


@needs_root
def test_main_runs_only_coding_quick_prints_one_json_object_and_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    small = CodingConfig(num_trajectories=3, num_problems=2, test_work_s=0.05, steps=1, calibration_problems=1)
    monkeypatch.setattr(CodingConfig, "quick", classmethod(lambda cls, seed=0: small))
    code = live.main(["--quick", "--json", "--only", "coding", "--report-dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert code == 0
    assert out["coding"]["rewards_correct"] == 1.0 and out["wall_s"] > 0
    assert "mopd" not in out and set(out["sim_vs_live_act_ratio"]) <= {"coding"}
    assert (tmp_path / "coding_act_cdf.png").stat().st_size > 0 and (tmp_path / "coding_cpu.png").exists()
