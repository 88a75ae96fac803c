"""SIGTERM to a real ``arl-tangram serve`` with its code-sandbox pool full (the SandboxFusion
face's ``max_envs`` of the tenant: every sandbox borrowed, most of their runs queued behind
the host's cores), one more code run waiting for a sandbox and a native action queued:
the process exits within ``[service] shutdown_grace_s``, every waiting client gets an
answer (no dropped connection, no 5xx but the documented 503/504 of a stopping service),
and every accepted action has a terminal result in the journal: the queued ones
``error`` / ``shutting_down``, the running ones ``cancelled``. And a stop held by work that
cannot be interrupted (a model loading on a worker thread) still ends within the grace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from arl_tangram.api.main import EXIT_STOP_OVERDUE
from arl_tangram.runtime.journal import Journal

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
GRACE_S = 6.0
POOL = 16  # the pool ``serve`` mounts here (its config's [sandboxfusion] max_envs): live code sandboxes per (tenant, size)
REPO = Path(__file__).resolve().parents[2]  # the serving process imports tests.api.registrable
RUN = {"code": "sleep 30", "language": "bash", "run_timeout": 60, "memory_limit_MB": 64}


def _serve(config: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "arl_tangram.cli", "serve", "--port", "0", "--config", str(config)]
    environ = {**os.environ, **(env or {})}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=environ)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on " in line, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return proc, line.split("listening on ")[1].split()[0]


async def _until(http: httpx.AsyncClient, ready: object, timeout_s: float = 90.0) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = (await http.get("/v1/status")).json()
        if ready(status):  # type: ignore[operator]
            return status  # type: ignore[no-any-return]
        await asyncio.sleep(0.1)
    raise AssertionError(f"not reached in {timeout_s} s: {status}")


async def test_sigterm_with_the_pool_full_ends_everything_within_the_grace(tmp_path: Path) -> None:
    journal = tmp_path / "journal.sqlite"
    config = tmp_path / "tangram.toml"
    config.write_text(f'[service]\njournal_path = "{journal}"\nshutdown_grace_s = {GRACE_S}\n[sandboxfusion]\nmax_envs = {POOL}\n')
    proc, url = _serve(config)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            env = (await http.post("/v1/envs", json={"memory": "64MiB"})).json()["env_id"]
            exec_ = {"type": "exec", "env_id": env, "command": "sleep 30", "cpu": {"min": 1, "max": 1}}
            assert (await http.post("/v1/actions", json={**exec_, "action_id": "running"})).status_code == 201
            for _ in range(300):
                if (await http.get("/v1/actions/running")).json()["state"] == "running":
                    break
                await asyncio.sleep(0.05)
            runs = [asyncio.create_task(http.post("/run_code", json=RUN)) for _ in range(POOL)]
            await _until(http, lambda s: s["num_envs"] == POOL + 1 and s["queue"]["cpu"] >= POOL - 2)
            waiting = asyncio.create_task(http.post("/run_code", json=RUN))  # no sandbox left for it
            for i in range(3):
                queued = await http.post("/v1/actions", json={**exec_, "action_id": f"queued-{i}"})
                assert queued.status_code == 201 and queued.json()["state"] == "queued", queued.text
            await asyncio.sleep(0.5)
            assert not waiting.done()
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = await asyncio.to_thread(proc.wait, 60)
            exit_s = time.monotonic() - stopped_at
            answers = await asyncio.gather(*runs, waiting, return_exceptions=True)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate(timeout=30)
    assert rc == 0 and exit_s <= GRACE_S, (rc, exit_s, stderr[-2000:])
    dropped = [a for a in answers if isinstance(a, BaseException)]
    assert not dropped, dropped
    codes = [a.status_code for a in answers if isinstance(a, httpx.Response)]
    assert all(c == 200 for c in codes[:-1]) and codes[-1] == 504, codes
    assert "shutting down" in answers[-1].json()["detail"]  # type: ignore[union-attr]
    store = Journal(str(journal))
    try:
        rows = store.load()  # (the code runs' actions were acknowledged by the face: not kept)
    finally:
        store.close()
    assert all(r.result is not None for r in rows), [r.action_id for r in rows if r.result is None]
    ended = {r.action_id.split(".", 1)[1]: (r.result["outcome"], r.result["cause"]) for r in rows if r.result}
    assert ended["running"][0] == "cancelled", ended
    assert all(ended[f"queued-{i}"] == ("error", "shutting_down") for i in range(3)), ended
    print(f"\nshutdown: exit {exit_s:.2f} s after SIGTERM (grace {GRACE_S:g} s); journal: {sorted(ended.items())}")


async def test_a_stop_held_by_a_loading_model_still_ends_within_the_grace(tmp_path: Path) -> None:
    journal, loading = tmp_path / "journal.sqlite", tmp_path / "loading"
    config = tmp_path / "tangram.toml"
    config.write_text(
        f'[gpu]\ndevices = 1\ndevice_mem_bytes = "64MiB"\n[service]\njournal_path = "{journal}"\nshutdown_grace_s = 4\n'
        'allowed_modules = ["tests.api.registrable:build_slow"]\n'
    )
    proc, url = _serve(config, {"TANGRAM_TEST_LOADING": str(loading)})
    try:
        async with httpx.AsyncClient(base_url=url, timeout=90) as http:
            done = await http.post("/v1/actions", json={"type": "noop", "action_id": "before"}, params={"wait_s": 10})
            assert done.json()["state"] == "done", done.text
            body = {"name": "slow", "handler": "logprobs", "module": "tests.api.registrable:build_slow"}
            registering = asyncio.create_task(http.post("/v1/services", json=body))
            for _ in range(600):
                if loading.exists() or registering.done():
                    break
                await asyncio.sleep(0.1)
            assert loading.exists(), registering.result().text if registering.done() else "the load never started"
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = await asyncio.to_thread(proc.wait, 60)
            exit_s = time.monotonic() - stopped_at
            registering.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate(timeout=30)
    assert rc == EXIT_STOP_OVERDUE and exit_s <= 4.0, (rc, exit_s, stderr[-2000:])
    assert "outlived shutdown_grace_s=4" in stderr
    store = Journal(str(journal))
    try:
        rows = store.load()
    finally:
        store.close()
    assert [(r.action_id, (r.result or {}).get("outcome")) for r in rows] == [("default.before", "succeeded")]
    print(f"\nheld stop: exit {exit_s:.2f} s after SIGTERM (grace 4 s), rc {rc}")
