"""The commands for people as a new user types them (issue 27, item 12), against a real
server: ids after options, documented exit codes of ``exec`` (never 247), a rejection in
plain units, the waiting line of ``env create`` on a full pool, help that shows defaults,
and ``status | head`` without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from arl_tangram import cli
from tests.client.conftest import serving

SRC = str(Path(cli.__file__).resolve().parents[1])


@pytest.fixture
def url() -> Iterator[str]:
    from tests.managers.cpu.conftest import IN_CI, host_can_sandbox

    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
    with serving(create_timeout_s=1.0) as server:
        yield server.url


@pytest.fixture
def reserving_url() -> Iterator[str]:
    """A server whose envs hold their memory limit for their life (``memory_per_action =
    false``, as pods do): there a pool is full by reservation. Under memory per action an
    idle env holds only its footprint, so one big env no longer fills a pool."""
    from arl_tangram.runtime.config import SchedulerConfig, TangramConfig
    from tests.managers.cpu.conftest import IN_CI, host_can_sandbox

    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
    config = TangramConfig(scheduler=SchedulerConfig(params={"memory_per_action": False}))
    with serving(config, create_timeout_s=1.0) as server:
        yield server.url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ids_after_options_and_exit_codes(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "env", "create", "--memory", "64MiB", "--url", url, "myenv")[:2] == (0, "myenv\n")
    assert run(capsys, "exec", "--url", url, "myenv", "--", "exit 4")[0] == 4  # the program's own
    code, _, err = run(capsys, "exec", "--url", url, "--timeout", "0.5", "myenv", "--", "sleep 5")
    assert code == 124 and "timed_out" in err
    code, _, err = run(capsys, "exec", "--url", url, "myenv", "--", "python3 -c 'x = bytearray(1 << 28)'")
    assert code == 137 and "oom_killed" in err
    assert run(capsys, "exec", "--url", url, "myenv", "--", "kill -9 $$")[0] == 137  # 128 + SIGKILL, not 247
    code, _, err = run(capsys, "exec", "--url", url, "--cpu", "64", "myenv", "--", "true")
    assert code == 2 and "rejected" in err and "64 cores" in err and "ResourceVector" not in err, err
    assert run(capsys, "env", "delete", "--url", url, "myenv")[0] == 0
    assert httpx.get(f"{url}/v1/envs").json()["envs"] == []


def test_env_create_on_a_full_pool_says_what_it_waits_for(reserving_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = reserving_url
    (pool,) = [p for p in httpx.get(f"{url}/v1/status").json()["pools"] if p["resource"] == "mem_bytes"]
    free = pool["capacity"] - pool["reserved"]
    hog = httpx.post(f"{url}/v1/envs", json={"memory": free - (32 << 20)}, timeout=60).json()["env_id"]
    try:
        with pytest.raises(SystemExit, match="503"):
            cli.main(["env", "create", "--url", url, "--memory", "64MiB"])
        err = capsys.readouterr().err
        assert "waiting for 64MiB of memory" in err and "create_timeout_s" in err, err
    finally:
        httpx.delete(f"{url}/v1/envs/{hog}")


def test_help_shows_defaults_and_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in (
        (["exec", "--help"], ("124 timed out", "137 killed for memory", "2 rejected", "130 cancelled")),
        (["env", "--help"], ("default: $ARL_TANGRAM_URL, else http://127.0.0.1:8080",)),
        (["service", "--help"], ("the service's name", "what a call computes")),
    ):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert all(w in text for w in words), (argv, text)


def test_status_into_a_closed_pipe_ends_quietly(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-m", "arl_tangram.cli", "status", "--url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_bad_services_folder_is_one_line_and_rc_2(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(f'[[services]]\nname = "reward/x"\nfolder = "{tmp_path}"\nhandler = "score"\n')
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.run([sys.executable, "-m", "arl_tangram.cli", "serve", "--port", "0", "--config", str(config)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "folder:" in p.stderr, p.stderr


