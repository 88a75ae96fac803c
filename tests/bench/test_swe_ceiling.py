"""The SWE workload's diagnostics (``swe_ceiling``, ``swe_result.spike``): the ACT ceiling
keeps the pool's capacity, and the spike tool reports what its allocation cost (run on a
CPU vs waiting for one), which the summary reads back. Pure or a short host process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from arl_tangram.bench.live.swe_ceiling import ceiling
from arl_tangram.bench.live.swe_plan import RolloutPlan
from arl_tangram.bench.live.swe_repo import PROFILE_MEM
from arl_tangram.bench.live.swe_result import spike
from arl_tangram.bench.live.swe_rollout import ActionRecord, RolloutOutcome
from arl_tangram.runtime.actions import ActionResult


def _outcome(kind: str, n: int, exec_s: float, stdout: str = "") -> RolloutOutcome:
    out = RolloutOutcome(RolloutPlan("r", 0, 0, True, ()), 0.0)
    out.actions = [ActionRecord(kind, 0.0, ActionResult(f"a{i}", kind, "succeeded", exec_s=exec_s, stdout=stdout)) for i in range(n)]
    return out


def test_the_ceiling_keeps_the_pools_cores() -> None:
    # four 1 s actions arriving together on one core: alone each takes 1 s, but at best
    # they end at 1, 2, 3 and 4 s (mean 2.5 s); the bound lies between (a lower bound, not tight)
    c = ceiling([_outcome("lint", 4, 1.0)], cores=1, baseline_mean_act_s=5.0)
    assert c["ideal_mean_act_s"] == pytest.approx(1.0)
    assert 1.5 <= c["bound_mean_act_s"] <= 2.5 + 1e-9
    assert c["act_gain_ceiling"] == pytest.approx(5.0 / c["bound_mean_act_s"])
    two = ceiling([_outcome("lint", 4, 1.0)], cores=2, baseline_mean_act_s=5.0)
    assert two["bound_mean_act_s"] < c["bound_mean_act_s"], "more cores, a lower bound"


def test_the_spike_tool_reports_its_allocations_cpu_and_wait(tmp_path: Path) -> None:
    tool = tmp_path / "profile_mem.py"
    tool.write_text(PROFILE_MEM)
    done = subprocess.run([sys.executable, str(tool), "16"], capture_output=True, text=True, timeout=60, check=True)
    s = spike([_outcome("profile", 1, 0.5, done.stdout)])
    assert s["reported"] == 1 and s["exec_s"] == 0.5
    assert 0 < s["alloc_run_s"] <= s["alloc_s"] + 0.05 and s["alloc_wait_s"] >= 0
    assert spike([_outcome("profile", 1, 0.5, "Killed")])["reported"] == 0, "a killed spike reports nothing"
