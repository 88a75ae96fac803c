"""``arl-tangram bench gpu --json`` runs end to end (tiny sizes) and prints the issue's keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arl_tangram.bench import gpu, gpu_stall, gpu_swap


def test_bench_prints_one_json_object_with_the_required_keys(
    model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--json",
        "--model-mb",
        "4",
        "--teacher-mb",
        "2",
        "--repeats",
        "2",
        "--mopd-requests",
        "20",
    ]
    argv += [
        "--mopd-tokens",
        "16",
        "--churn-steps",
        "150",
        "--churn-scale",
        "4096",
        "--swap-mb",
        "16",
        "--stall-s",
        "1",
        "--cache-dir",
        str(model_cache),
        "--cpu",
    ]
    assert gpu.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    for key in (
        "device",
        "raw_copy_gbps",
        "swap_in_gbps",
        "swap_efficiency",
        "swap_efficiency_p25",
        "swap_efficiency_p75",
        "cold_load_s",
        "swap_in_s",
        "swap_vs_cold",
        "fragmentation_largest_free_ratio",
        "fragmentation_largest_free_extent_ratio",
        "loop_stall_p99_ms",
        "resident_call_slowdown_during_swaps",
        "resident_call_p50_ms_quiet",
        "resident_call_p50_ms_churn",
        "resident_call_churn_ratio",
    ):
        assert isinstance(result[key], (int, float, str)), key
    mopd = result["mopd"]
    for key in ("static_p50_ms", "tangram_p50_ms", "static_device_bytes", "tangram_device_bytes"):
        assert mopd[key] > 0, key
    assert mopd["tangram_device_bytes"] * 3 == mopd["static_device_bytes"]
    assert mopd["static_swap_ins"] == 0 and mopd["tangram_swap_ins"] > 0
    assert 0 < result["fragmentation_largest_free_extent_ratio"] <= 1
    assert result["loop_stall_p99_ms"] >= 0 and result["resident_call_slowdown_during_swaps"] > 0
    assert result["swap_efficiency_p25"] <= result["swap_efficiency"]
    assert result["swap_efficiency"] <= result["swap_efficiency_p75"]
    assert result["swap_efficiency_rounds"] == 20  # the default, after the warm-up rounds


def test_each_swap_in_is_compared_with_the_raw_copies_around_it() -> None:
    # The host slows down 3x partway; each swap-in takes 1.25x the raw copies around it.
    raws = [1.0, 1.0, 3.0, 3.0, 3.0]
    swaps = [1.25 * (raws[i] + raws[i + 1]) / 2 for i in range(4)]
    assert gpu_swap.bracketed_ratios(raws, swaps) == pytest.approx([0.8] * 4)
    out = gpu_swap.summarise(raws, swaps, payload=10**9)
    assert out["swap_efficiency"] == out["swap_efficiency_p25"] == pytest.approx(0.8)
    assert out["swap_efficiency_p75"] == pytest.approx(0.8)
    assert out["swap_efficiency_rounds"] == 4 and out["swap_efficiency_by_round"] == [0.8] * 4
    # The medians of the two lists taken apart come from different rounds: 3.0 / 3.125 = 0.96.
    assert out["raw_copy_s"] / out["swap_in_s"] == pytest.approx(0.96)
    with pytest.raises(ValueError):
        gpu_swap.bracketed_ratios(raws, swaps[:2])


def test_stall_samples_are_classed_by_overlap_with_a_swap() -> None:
    spans = [(1.0, 2.0), (3.0, 3.5)]
    samples = [(0.0, 0.5), (0.9, 1.1), (1.2, 1.3), (1.99, 2.5), (2.1, 2.9), (3.4, 4.0), (5, 6)]
    during, outside = gpu_stall._split(samples, spans)
    assert len(during) == 4 and len(outside) == 3
    assert sorted(outside) == pytest.approx([500.0, 800.0, 1000.0])
