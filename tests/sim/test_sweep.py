"""The sweep's settings and figures, and the paper summary's new keys, on literal rows."""

from __future__ import annotations

from typing import Any

import pytest

from arl_tangram.sim import paper, sweep


def test_settings_cover_every_parameter_both_ways_and_the_seeds() -> None:
    names = [n for n, _, _ in sweep.settings(5)]
    assert names[:5] == [f"seed-{s}" for s in range(1, 6)]
    assert len(names) == 5 + 2 * len(sweep.PERTURBED)
    wp = dict((n, w) for n, w, _ in sweep.settings(5))
    assert wp["think_mean_sx0.5"]["think_mean_s"] == pytest.approx(0.5 * 2.3)
    assert wp["test_fractionx2"]["test_fraction"] == pytest.approx(0.8)


def test_the_second_seed_set_runs_its_seeds_and_perturbs_at_its_first() -> None:
    second = sweep.settings(sweep.SEED_SETS["second"])
    assert [n for n, _, _ in second[:5]] == [f"seed-{s}" for s in (11, 13, 17, 19, 23)]
    assert {seed for n, _, seed in second[5:]} == {11}
    assert [n for n, _, _ in second[5:]] == [n for n, _, _ in sweep.settings(5)[5:]]


def test_every_setting_runs_every_system_and_only_elastic_gets_the_bound() -> None:
    specs = sweep.specs_for("seed-1", {"batch": 1280}, 1)
    assert [s.label for s in specs] == [
        "elastic", "fixed-dop-4", "fixed-dop-8", "fixed-dop-12", "fixed-dop-16", "fixed-dop-20", "fixed-dop-24", "fixed-dop-32",
        "k8s-static", "k8s-static+control-plane", "ideal",
    ]
    assert [s.bound for s in specs] == [True] + [False] * 10
    assert {s.cpu_nodes for s in specs} == {15}


def _row(label: str, act: float, step: float = 10.0, **extra: Any) -> dict[str, Any]:
    return {"experiment": "s", "label": label, "act": {"mean_s": act}, "step_s": step, "env_busy_fraction": 0.47, **extra}


def _rows(elastic: float, fixed16: float, fixed4: float = 2.0, fixed32: float = 1.1) -> list[dict[str, Any]]:
    return [
        _row("elastic", elastic, 8.0, bound={"mean_s": 0.8, "ideal_mean_s": 0.7}),
        _row("fixed-dop-4", fixed4), _row("fixed-dop-8", 1.2), _row("fixed-dop-12", 1.0), _row("fixed-dop-16", fixed16),
        _row("fixed-dop-20", 1.0), _row("fixed-dop-24", 1.05), _row("fixed-dop-32", fixed32),
        _row("k8s-static", 3.0, 12.0), _row("k8s-static+control-plane", 5.0, 20.0), _row("ideal", 0.7),
    ]


def test_setting_figures_margin_against_the_best_fixed_dop() -> None:
    f = sweep.setting_figures(_rows(0.9, 0.95))
    assert f["best_fixed_dop"] == 16
    assert f["margin_vs_best_fixed"] == pytest.approx(0.95 / 0.9)
    assert f["elastic_beats_all_fixed"]
    assert f["bound_ratio"] == pytest.approx(0.9 / 0.8)
    assert f["step_gain"] == pytest.approx(12.0 / 8.0)
    lost = sweep.setting_figures(_rows(1.0, 0.95))
    assert not lost["elastic_beats_all_fixed"]  # 1.0 > 1.01 x 0.95


def test_summary_keys_and_values() -> None:
    per = {"seed-1": sweep.setting_figures(_rows(0.9, 0.95)), "seed-2": sweep.setting_figures(_rows(1.0, 0.95))}
    s = sweep.summarize(per)
    assert s["elastic_beats_all_fixed_fraction"] == 0.5
    assert s["headline_margin_vs_best_fixed"] == pytest.approx(0.95 / 0.9)
    assert s["coding_bound_ratio"] == pytest.approx(0.9 / 0.8)
    assert s["step_gain_min_over_seeds"] == pytest.approx(1.5)
    assert s["settings_missed"] == ["seed-2"]


def test_worst_regret_per_fixed_dop_names_its_setting_and_the_best_single_dop() -> None:
    per = {
        "seed-1": sweep.setting_figures(_rows(0.9, 0.95, fixed4=2.0, fixed32=1.1)),
        "sigmax2": sweep.setting_figures(_rows(0.5, 0.95, fixed4=1.0, fixed32=0.6)),
    }
    s = sweep.summarize(per)
    worst = s["worst_regret_by_fixed_dop"]
    assert set(worst) == {str(d) for d in sweep.FIXED_DOPS}
    assert worst["4"] == {"ratio": pytest.approx(2.0 / 0.9), "setting": "seed-1"}
    assert worst["16"] == {"ratio": pytest.approx(0.95 / 0.5), "setting": "sigmax2"}
    assert worst["32"] == {"ratio": pytest.approx(1.1 / 0.9), "setting": "seed-1"}
    assert s["min_worst_regret"] == pytest.approx(1.1 / 0.9)
    assert s["min_worst_regret_dop"] == 32


def test_the_regret_ceiling_splits_what_the_settings_allow_from_elastic_margin() -> None:
    per = {
        "seed-1": sweep.setting_figures(_rows(0.9, 0.95, fixed4=2.0, fixed32=1.1)),  # best fixed: 16 at 0.95
        "sigmax2": sweep.setting_figures(_rows(0.5, 0.95, fixed4=1.0, fixed32=0.6)),  # best fixed: 32 at 0.6
    }
    s = sweep.summarize(per)
    among = sweep.worst_regret_by_fixed_dop(per, against_best_fixed=True)
    assert among["32"] == {"ratio": pytest.approx(1.1 / 0.95), "setting": "seed-1"}
    assert among["20"] == {"ratio": pytest.approx(1.0 / 0.6), "setting": "sigmax2"}
    assert s["min_worst_regret_vs_best_fixed"] == pytest.approx(1.1 / 0.95)  # fixed 32's worst, against the best fixed
    assert s["min_worst_regret_ceiling"] == pytest.approx(1.1 / 0.95 * 0.6 / 0.5)  # x elastic's largest margin (sigmax2)
    assert s["min_worst_regret"] <= s["min_worst_regret_ceiling"] + 1e-12


def test_regrets_ignore_settings_beyond_the_base_nineteen() -> None:
    per = {f"seed-{k}": sweep.setting_figures(_rows(0.9, 0.95)) for k in range(1, 6)}
    per["seed-6"] = sweep.setting_figures(_rows(0.5, 0.95, fixed32=5.0))  # a sixth seed is an added setting
    per["sigmax2"] = sweep.setting_figures(_rows(0.9, 0.95))
    assert sweep.regret_settings(per) == [f"seed-{k}" for k in range(1, 6)] + ["sigmax2"]
    assert sweep.summarize(per)["worst_regret_by_fixed_dop"]["32"]["ratio"] == pytest.approx(1.1 / 0.9)


def test_paper_batch_growth_names_the_sizing_nearer_the_paper() -> None:
    out = paper._batch_growth({"256": 2.0, "1536": 4.0}, {"256": 1.4, "1536": 7.6})
    assert out["coding_gain_growth_pods_for_default_batch"] == pytest.approx(2.0)
    assert out["coding_gain_growth_pods_for_smallest_batch"] == pytest.approx(7.6 / 1.4)
    assert out["coding_gain_growth_nearer_paper"] == "pods-for-smallest-batch"


def test_paper_runs_fixed_dops_and_seeds_at_the_headline_scale() -> None:
    specs = paper.coding_specs()
    fixed = [s for s in specs if s.experiment == "coding-fixed-dop"]
    assert sorted(s.policy_params["dop"] for s in fixed) == [4, 8, 12, 16, 20, 24, 32]
    assert {(s.cpu_nodes, s.workload_params["batch"]) for s in fixed} == {(15, 1280)}
    seeds = {s.seed for s in specs if s.experiment == "coding-seeds"}
    assert seeds == {2, 3, 4, 5}
    small = [s for s in specs if s.label == "k8s-static-pods-for-smallest-batch"]
    assert len(small) == len(paper.SWEEP_BATCHES)
    assert {s.policy_params["pod_millicores"] for s in small} == {paper.pod_millicores(256)}


def test_an_unknown_setting_is_refused_by_name_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--settings", "seed-1,sigmax3", "--quick", "--no-plots", "--workers", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--settings" in err and "'sigmax3'" in err and "seed-1" in err
