"""Leases and restarts seen over HTTP: an env whose lease ran out answers 410 saying so
(its owner only: others still get 404), and a service killed with SIGKILL and restarted on
the same journal gives every accepted action an outcome, readable by its id."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from arl_tangram.runtime.config import ServiceSettings, TangramConfig
from tests.api.conftest import serving

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]


async def test_an_expired_env_answers_410_to_its_owner(sandbox_host: None) -> None:
    config = TangramConfig(service=ServiceSettings(env_idle_ttl_s=0.4))
    with serving(config, tokens={"tok-a": "alice", "tok-b": "bob"}) as server:
        alice = httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer tok-a"}, timeout=30)
        bob = httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer tok-b"}, timeout=30)
        async with alice, bob:
            env = (await alice.post("/v1/envs", json={"memory": "128MiB"})).json()["env_id"]
            for _ in range(3):  # use renews the lease
                await asyncio.sleep(0.25)
                assert (await alice.post(f"/v1/envs/{env}/renew")).status_code == 204
            await asyncio.sleep(1.5)
            gone = await alice.get(f"/v1/envs/{env}")
            assert gone.status_code == 410 and "lease ran out" in gone.json()["rule"], gone.text
            assert (await bob.get(f"/v1/envs/{env}")).status_code == 404
            assert (await alice.get("/v1/envs")).json()["envs"] == []


def _serve(config: Path) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "arl_tangram.cli", "serve", "--port", "0", "--config", str(config)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on " in line, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
    return proc, line.split("listening on ")[1].split()[0]


async def test_a_killed_service_gives_every_accepted_action_an_outcome_after_restart(tmp_path: Path) -> None:
    config = tmp_path / "tangram.toml"
    config.write_text(f'[service]\njournal_path = "{tmp_path / "journal.sqlite"}"\n')
    proc, url = _serve(config)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            env = (await http.post("/v1/envs", json={"memory": "128MiB"})).json()["env_id"]
            body = {"type": "exec", "env_id": env, "command": "sleep 60", "cpu": {"min": 2, "max": 2}}
            running = (await http.post("/v1/actions", json={**body, "action_id": "long-1"})).json()
            queued = (await http.post("/v1/actions", json={**body, "action_id": "long-2"})).json()
            done = (await http.post("/v1/actions", json={"type": "noop", "action_id": "quick-1"}, params={"wait_s": 5})).json()
            for _ in range(100):
                if (await http.get("/v1/actions/long-1")).json()["state"] == "running":
                    break
                await asyncio.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert running["state"] in ("queued", "running") and queued["state"] == "queued" and done["state"] == "done"
    proc, url = _serve(config)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            outcomes = {}
            for action_id in ("long-1", "long-2", "quick-1"):
                r = await http.get(f"/v1/actions/{action_id}/wait", params={"timeout_s": 20})
                assert r.status_code == 200, (action_id, r.text)
                outcomes[action_id] = (r.json()["state"], r.json()["result"]["outcome"], r.json()["result"]["cause"])
                assert r.json()["type"] == ("noop" if action_id == "quick-1" else "exec")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert outcomes["quick-1"][:2] == ("done", "succeeded")
    assert outcomes["long-1"][1] == "error" and "service_restarted" in (outcomes["long-1"][2] or ""), outcomes
    # the queued one never started: re-run after the restart, its env is gone with the old process
    assert outcomes["long-2"][0] == "done" and outcomes["long-2"][1] != "succeeded", outcomes
