"""``bench live --quick``'s budget levers (issue 24, the demo's wall time): the quick swe run
leaves the dominated pod system to the full run and says so in the JSON, the table and the
closing sentence. Pure: no sandbox runs."""

from __future__ import annotations

from arl_tangram.bench.live.report import render
from arl_tangram.bench.live.swe_plan import NOT_RUN_QUICK, SYSTEMS, RolloutPlan, SweConfig
from arl_tangram.bench.live.swe_result import workload_result
from arl_tangram.bench.live.swe_rollout import ActionRecord, RolloutOutcome
from arl_tangram.runtime.actions import ActionResult

SKIPPED = "k8s-guaranteed-fit"


def test_quick_leaves_guaranteed_fit_to_the_full_run_which_it_is_dominated_by_construction() -> None:
    quick, full = SweConfig.quick(), SweConfig()
    assert SKIPPED not in quick.systems and quick.not_run == (SKIPPED,)
    assert full.systems == SYSTEMS and full.not_run == ()
    assert (quick.num_tasks, quick.group_size) == (full.num_tasks // 2, full.group_size), "quick halves T only"
    # the dominance the skip rests on: burstable-fit's request and memory limit, a CPU limit added
    burst, guar = quick.pod_size("k8s-burstable-fit", 2), quick.pod_size(SKIPPED, 2)
    assert (guar.millicores, guar.mem_bytes) == (burst.millicores, burst.mem_bytes)
    assert guar.guaranteed and not burst.guaranteed


def _outcome(system: str, exec_s: float) -> RolloutOutcome:
    out = RolloutOutcome(RolloutPlan(f"{system}-r0", 0, 0, True, ()), 0.0, ended_s=exec_s, verdict=True, marker_ok=True)
    out.actions = [ActionRecord("lint", 0.0, ActionResult("a0", "lint", "succeeded", exec_s=exec_s))]
    return out


def test_a_quick_run_names_the_system_it_left_out_in_json_table_and_sentence() -> None:
    config = SweConfig.quick()
    runs = {s: ([_outcome(s, 1.0 + i)], 1.0 + i) for i, s in enumerate(config.systems)}
    result = workload_result(runs, config, cores=2)
    assert result.summary["not_run_systems"] == {SKIPPED: NOT_RUN_QUICK}
    assert {r.system for r in result.runs} == set(config.systems)
    table, closing = render([result], {}, {}, 1.0).split("== in short ==")
    assert f"\n{SKIPPED:<16} {NOT_RUN_QUICK}\n" in table, "a row in the swe table"
    assert f"{SKIPPED} {NOT_RUN_QUICK}." in closing, "said in the closing sentence"
    full = workload_result(runs, SweConfig(), cores=2)
    assert full.summary["not_run_systems"] == {} and NOT_RUN_QUICK not in render([full], {}, {}, 1.0)
