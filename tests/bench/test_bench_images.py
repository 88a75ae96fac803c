"""``arl-tangram bench images --quick``: the images benchmark end to end at small sizes
(a base from host files, a loopback registry, real sandboxes), through the CLI's entry point:
exactly the issue's keys, with values that say the parts worked."""

from __future__ import annotations

import json

import pytest

from arl_tangram import cli
from arl_tangram.bench.images import KEYS

pytestmark = pytest.mark.usefixtures("sandbox_host")


def test_bench_images_quick_json_has_exactly_the_issues_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "images", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == set(KEYS) == {
        "create_warm_p50_ms", "create_warm_p99_ms", "create_cold_s", "cold_image_bytes", "pull_unpack_mb_per_s",
        "tar_x_mb_per_s", "store_bytes_ratio", "blob_fetches_per_layer_in_burst", "exec_true_p50_ms_image",
        "exec_true_p50_ms_host", "swe_task_ok",
    }  # fmt: skip
    for key in KEYS[:-1]:
        assert isinstance(result[key], (int, float)) and result[key] > 0, key
    assert result["create_warm_p50_ms"] <= result["create_warm_p99_ms"]
    assert result["blob_fetches_per_layer_in_burst"] == 1.0  # one fetch per layer, however many envs wait
    assert result["store_bytes_ratio"] < 0.5  # the base is stored once for all 10 images
    assert result["swe_task_ok"] is True
