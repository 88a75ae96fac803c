"""The command line against a real ``arl-tangram serve`` subprocess (it prints where it
listens; SIGTERM stops it with every sandbox destroyed), and the HTTP keys of
``bench overhead`` (loose bounds: the host is shared, the README has the figures)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from arl_tangram import cli
from arl_tangram.bench.overhead_http import measure_http

pytestmark = pytest.mark.usefixtures("sandbox_host")


def test_serve_and_the_commands_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [sys.executable, "-m", "arl_tangram.cli", "serve", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = ["--url", line.split("listening on ")[1].split()[0]]
        assert cli.main(["env", "create", "--memory", "128MiB", *url]) == 0
        env_id = capsys.readouterr().out.strip()
        assert cli.main(["exec", env_id, "echo hello from $TANGRAM_DOP", *url]) == 0
        assert capsys.readouterr().out == "hello from 1\n"
        assert cli.main(["exec", env_id, "exit 4", *url]) == 4
        assert cli.main(["status", *url]) == 0
        out = capsys.readouterr().out
        assert "sandboxes: idle 1" in out and "local/cpu" in out
        assert cli.main(["env", "list", *url]) == 0 and env_id in capsys.readouterr().out
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped; 1 sandbox(es) destroyed" in err, err


def test_a_client_command_without_a_server_says_so() -> None:
    with pytest.raises(SystemExit, match="cannot reach"):
        cli.main(["status", "--url", "http://127.0.0.1:9"])


def test_bench_overhead_http_keys() -> None:
    r = measure_http(quick=True)
    assert 0 < r["http_submit_to_start_p50_ms"] <= r["http_submit_to_start_p99_ms"] < 1000
    assert r["http_noop_actions_per_s"] > 50 and r["http_samples"]["clients"] == 32
