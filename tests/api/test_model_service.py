"""A real small model over HTTP: MiniLM as a reward service the operator configured (shared
by every tenant) and as a tenant's own service (private: another tenant gets 404)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from arl_tangram.runtime.config import GpuConfig, ServiceConfig, ServiceSettings, TangramConfig
from tests.api.conftest import serving

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
SAME = {"a": "The cat sat on the mat.", "b": "A cat was sitting on the mat."}
OTHER = {"a": "The cat sat on the mat.", "b": "Quarterly revenue rose by four percent."}


async def _score(http: httpx.AsyncClient, service: str, pair: dict[str, str]) -> httpx.Response:
    return await http.post("/v1/actions", json={"type": "service", "service": service, "request": pair}, params={"wait_s": 120})


async def test_minilm_shared_by_the_operator_and_private_to_a_tenant(sandbox_host: None) -> None:
    from arl_tangram.managers.gpu.models import minilm_path

    folder = str(minilm_path())
    config = TangramConfig(
        gpu=GpuConfig(devices=1, device_mem_bytes=256 << 20),
        services=(ServiceConfig("reward/minilm", "score", folder=folder),),
        service=ServiceSettings(allowed_folders=(folder,)),  # tenants may register it too
    )
    with serving(config, tokens={"tok-a": "alice", "tok-b": "bob"}) as server:
        alice = httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer tok-a"}, timeout=180)
        bob = httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer tok-b"}, timeout=180)
        async with alice, bob:
            same, other = await asyncio.gather(_score(alice, "reward/minilm", SAME), _score(bob, "reward/minilm", OTHER))
            rs, ro = same.json()["result"], other.json()["result"]
            assert rs["outcome"] == ro["outcome"] == "succeeded", (rs["cause"], ro["cause"])
            assert rs["output"]["score"] > ro["output"]["score"] and same.json()["kind"] == "reward/minilm"
            listed = (await bob.get("/v1/services")).json()["services"]
            assert [(s["name"], s["shared"]) for s in listed] == [("reward/minilm", True)]

            registered = await alice.post("/v1/services", json={"name": "judge", "handler": "score", "folder": folder})
            assert registered.status_code == 201 and registered.json()["shared"] is False, registered.text
            mine = (await _score(alice, "judge", SAME)).json()
            assert mine["result"]["outcome"] == "succeeded" and mine["kind"] == "judge", mine["result"]["cause"]
            assert (await bob.get("/v1/services/judge")).status_code == 404
            assert (await _score(bob, "judge", SAME)).status_code == 404
            assert {s["name"] for s in (await alice.get("/v1/services")).json()["services"]} == {"judge", "reward/minilm"}
            bad = (await _score(alice, "reward/minilm", {"a": "only one side"})).json()["result"]
            assert bad["outcome"] == "error" and "b" in bad["cause"]
            text = (await alice.get("/metrics")).text
    swaps = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert swaps["tangram_gpu_swap_ins_total"] >= 2  # one device of 256 MiB: the two models took turns
