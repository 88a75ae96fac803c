"""The processor-sharing baseline (``sim/processor_sharing.py``) on hand-checked instances,
and its place in the sweep's figures (``elastic_vs_processor_sharing_min``)."""

from __future__ import annotations

import pytest

from arl_tangram.sim import sweep
from arl_tangram.sim.bound import BoundInstance
from arl_tangram.sim.processor_sharing import processor_sharing_mean_act_s as ps_mean

INF = float("inf")


def test_equal_shares_and_linear_slowdown_below_one_core() -> None:
    assert ps_mean(BoundInstance.of([0, 0], [[2.0], [2.0]], 1)) == pytest.approx(4.0)  # half a core each
    assert ps_mean(BoundInstance.of([0, 0], [[2.0], [2.0]], 2)) == pytest.approx(2.0)
    # a short job arriving under a long one shares the core: 1 s of work at half speed
    assert ps_mean(BoundInstance.of([0, 1], [[10.0], [1.0]], 1)) == pytest.approx(((11.0) + 2.0) / 2)


def test_shares_are_capped_at_dop_max_and_elastic_curves_apply() -> None:
    assert ps_mean(BoundInstance.of([0], [[4.0, 2.0]], 8)) == pytest.approx(2.0)  # capped at its 2 cores
    # dop_min 2 (T(1) infeasible), two at once on 2 cores: 1 core each, half the rate at 2
    assert ps_mean(BoundInstance.of([0, 0], [[INF, 3.0], [INF, 3.0]], 2)) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="DoP"):
        ps_mean(BoundInstance.of([0], [[INF, 3.0]], 1))
    assert ps_mean(BoundInstance.of([0], [[1.0]], 1, overhead_s=0.5)) == pytest.approx(1.5)


def test_the_sweep_reports_elastic_against_processor_sharing() -> None:
    def row(label: str, act: float, **extra: object) -> dict[str, object]:
        return {"label": label, "act": {"mean_s": act}, "step_s": 10.0, "env_busy_fraction": 0.5, **extra}

    rows = [
        row("elastic", 1.0, bound={"mean_s": 0.8, "ideal_mean_s": 0.7}, processor_sharing={"mean_s": 1.5}),
        *(row(f"fixed-dop-{d}", 2.0) for d in sweep.FIXED_DOPS),
        row("k8s-static", 3.0), row("k8s-static+control-plane", 5.0), row("ideal", 0.7),
    ]
    f = sweep.setting_figures(rows)  # type: ignore[arg-type]
    assert f["elastic_vs_processor_sharing"] == pytest.approx(1.5)
    assert f["processor_sharing_vs_bound"] == pytest.approx(1.5 / 0.8)
    assert f["processor_sharing_vs_ideal"] == pytest.approx(1.5 / 0.7)
    # a quiet setting: processor sharing 1.02 x the bound, so no fixed-DoP schedule beats it by more
    quiet = dict(rows[0], bound={"mean_s": 1.0, "ideal_mean_s": 0.9}, processor_sharing={"mean_s": 1.02}, act={"mean_s": 1.01})
    g = sweep.setting_figures([quiet, *rows[1:]])  # type: ignore[arg-type]
    summary = sweep.summarize({"seed-1": f, "think_mean_sx2": g})
    assert summary["elastic_vs_processor_sharing_min"] == pytest.approx(1.02 / 1.01)
    assert summary["elastic_vs_processor_sharing_worst_setting"] == "think_mean_sx2"
    assert summary["processor_sharing_vs_bound_min"] == pytest.approx(1.02)
    assert summary["processor_sharing_vs_bound_worst_setting"] == "think_mean_sx2"
    # no schedule at all beats the ideal: 1.02 / 0.9 is the most any policy's ratio can be there
    assert summary["processor_sharing_vs_ideal_min"] == pytest.approx(1.02 / 0.9)
    assert summary["processor_sharing_vs_ideal_worst_setting"] == "think_mean_sx2"
    assert sweep.TARGETS["elastic_vs_processor_sharing_min"] == (">=", 1.1)
