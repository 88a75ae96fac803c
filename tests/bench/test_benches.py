"""The ``arl-tangram bench`` commands run end to end at tiny sizes and print the issues' keys."""

from __future__ import annotations

import json

import pytest

from arl_tangram import cli
from arl_tangram.bench import cpu, scheduler


def test_bench_scheduler_json_has_rounds_per_queue_depth(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler.main(["--json", "--rounds", "20", "--queued", "50", "300"]) == 0
    result = json.loads(capsys.readouterr().out)
    rounds = result["rounds"]
    assert [r["queued_target"] for r in rounds] == [50, 300]
    for r in rounds:
        assert r["queued"] >= r["queued_target"] * 0.9  # the queue is really that deep
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert set(result["targets"]) == {"p99_ms@1000", "p99_ms@10000"}


def test_bench_cpu_json_has_every_key_of_the_issue(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--json", "--creates", "3", "--resizes", "10", "--restarts", "2", "--execs", "5",
            "--enforce-seconds", "0.5", "--idle-sandboxes", "3", "--held-sandboxes", "5", "--idle-seconds", "0.5",
            "--timeout-actions", "40", "--timeout-sandboxes", "4", "--destroy-tasks", "50", "--leftover-actions", "10"]
    assert cpu.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("create_p50_ms", "create_p99_ms", "resize_p50_us", "resize_p99_us", "restart_p50_ms",
                "resize_vs_restart", "exec_true_p50_ms", "enforce_error", "idle_cpu_cores",
                "idle_mem_mb_per_sandbox", "idle_sandboxes"):
        assert isinstance(result[key], (int, float)), key
    assert result["idle_sandboxes"] == 5
    assert result["idle_cpu_cores"] < 0.5  # frozen sandboxes with busy loops use (almost) nothing
    assert result["timeout_actions"] == 40
    assert result["destroy_busy_ms"] > 0 and result["action_leftover_procs"] == 0
    assert result["timed_out_alive_after_grace"] == result["timed_out_post_marker"] == result["timeout_wrong_outcome"] == 0


def test_cli_names_the_missing_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "tpu"])
    assert info.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    assert cli.main(["version"]) == 0
