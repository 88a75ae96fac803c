"""Overload is answered at once (503 with Retry-After, never a hang), and the Prometheus
metrics scraped after a workload count exactly the actions that were run."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from arl_tangram.api.server import ServerThread
from tests.api.conftest import serving

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]


async def test_a_full_queue_gets_503_with_retry_after_not_a_hang(sandbox_host: None) -> None:
    with serving(max_queued_actions=2) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            env = (await http.post("/v1/envs", json={"memory": "128MiB"})).json()["env_id"]
            body = {"type": "exec", "env_id": env, "command": "sleep 30"}
            held = [(await http.post("/v1/actions", json=body)).json()["action_id"] for _ in range(2)]
            t0 = time.monotonic()
            r = await http.post("/v1/actions", json=body, params={"wait_s": 30})
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
            assert time.monotonic() - t0 < 1.0 and "max_queued_actions" in r.json()["rule"]
            for action_id in held:
                await http.post(f"/v1/actions/{action_id}/cancel")
                await http.get(f"/v1/actions/{action_id}/wait", params={"timeout_s": 20})
            r = await http.post("/v1/actions", json={"type": "noop"}, params={"wait_s": 5})
            assert r.status_code == 201 and r.json()["result"]["outcome"] == "succeeded"  # room again
            metrics = (await http.get("/metrics")).text
            assert 'tangram_actions_total{kind="exec",outcome="cancelled",tenant="default"} 2.0' in metrics
            assert 'tangram_http_overload_total{status="503"} 1.0' in metrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_after_a_workload_count_the_actions_run(server: ServerThread) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        env = (await http.post("/v1/envs", json={"memory": "128MiB"})).json()["env_id"]
        noops = [http.post("/v1/actions", json={"type": "noop"}, params={"wait_s": 10}) for _ in range(7)]
        execs = [http.post("/v1/actions", json={"type": "exec", "env_id": env, "command": f"exit {i % 2}"}, params={"wait_s": 20}) for i in range(4)]
        results = [r.json()["result"]["outcome"] for r in await asyncio.gather(*noops, *execs)]
        assert results.count("succeeded") == 9 and results.count("failed") == 2
        text = (await http.get("/metrics")).text
        s = _samples(text)
    noop, ex = (("kind", "noop"), ("tenant", "default")), (("kind", "exec"), ("tenant", "default"))
    assert s[("tangram_actions_total", (("kind", "noop"), ("outcome", "succeeded"), ("tenant", "default")))] == 7
    assert s[("tangram_actions_total", (("kind", "exec"), ("outcome", "succeeded"), ("tenant", "default")))] == 2
    assert s[("tangram_actions_total", (("kind", "exec"), ("outcome", "failed"), ("tenant", "default")))] == 2
    assert s[("tangram_actions_submitted_total", noop)] == 7 and s[("tangram_actions_submitted_total", ex)] == 4
    for part in ("queue", "exec", "overhead"):
        assert s[(f"tangram_action_{part}_seconds_count", noop)] == 7
        assert s[(f"tangram_action_{part}_seconds_count", ex)] == 4
    assert s[("tangram_action_exec_seconds_sum", ex)] > 0
    assert s[("tangram_queue_length", (("lane", "cpu"),))] == 0
    assert s[("tangram_sandboxes", (("state", "idle"),))] == 1
    assert s[("tangram_pool_reserved", (("pool", "local/cpu"), ("resource", "mem_bytes")))] == 128 << 20
    assert s[("tangram_pool_capacity", (("pool", "local/cpu"), ("resource", "cpu_millicores")))] >= 1000
    assert s[("tangram_controller_rounds_total", ())] >= 1
    assert s[("tangram_pending_actions", ())] == 0
    # every metric the Grafana dashboard plots is one this server exports
    exported = {name for name, _labels in s} | set(re.findall(r"^# TYPE (\S+)", text, re.MULTILINE))
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana" / "arl-tangram.json").read_text())
    plotted = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"tangram_\w+", t["expr"])}
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in exported}
    missing = {m for m in plotted if m not in exported and re.sub(r"_(total|bucket|sum|count)$", "", m) not in families}
    assert len(plotted) >= 15 and not missing, missing


async def test_status_and_metrics_report_memory_per_action(server: ServerThread) -> None:
    """Footprints, grants, used and learned peaks per kind (issue 21) in /v1/status and
    /metrics, after actions of one kind taught the core their peak."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        env = (await http.post("/v1/envs", json={"memory": "128MiB"})).json()["env_id"]
        body = {"type": "exec", "env_id": env, "command": "true", "kind": "probe", "memory": "8MiB"}
        for _ in range(3):
            r = await http.post("/v1/actions", json=body, params={"wait_s": 20})
            assert r.json()["result"]["outcome"] == "succeeded", r.text
        too_much = await http.post("/v1/actions", json={**body, "memory": "1GiB"})
        assert too_much.status_code in (400, 422) and "memory" in too_much.text
        mem = (await http.get("/v1/status")).json()["memory"]
        s = _samples((await http.get("/metrics")).text)
    assert mem["footprint_bytes"] > 0 and mem["granted_bytes"] == 0 and mem["paused_actions"] == 0
    assert mem["learned_peak_bytes"]["probe"] > 0
    assert s[("tangram_memory_learned_peak_bytes", (("kind", "probe"),))] == mem["learned_peak_bytes"]["probe"]
    assert s[("tangram_memory_footprint_bytes", ())] == mem["footprint_bytes"]
