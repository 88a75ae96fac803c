"""``/metrics`` over two tenants: each tenant's token shows its own tenant-labelled series
and none of the other's; the shared service's gauges are everyone's; the operator's
``[service] metrics_token`` shows every tenant's series; no known token: 401."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from arl_tangram.runtime.config import ConfigError, ServiceSettings, TangramConfig, parse_config
from tests.api.conftest import serving

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
TOKENS = {"tok-a": "alice", "tok-b": "bob"}


def _tenants_and_names(text: str) -> tuple[set[str], set[str]]:
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return {s.labels["tenant"] for s in samples if "tenant" in s.labels}, {s.name for s in samples}


async def _scrape(url: str, token: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        return await http.get("/metrics")


async def test_each_tenant_sees_its_own_series_and_the_operator_sees_all() -> None:
    config = TangramConfig(service=ServiceSettings(metrics_token="ops-secret"))
    with serving(config, tokens=TOKENS) as server:
        for token in TOKENS:
            async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
                r = await http.post("/v1/actions", json={"type": "noop"}, params={"wait_s": 10})
                assert r.json()["state"] == "done", r.text
        seen = {token: _tenants_and_names((await _scrape(server.url, token)).text) for token in (*TOKENS, "ops-secret")}
        unknown = await _scrape(server.url, "tok-nobody")
    assert seen["tok-a"][0] == {"alice"} and seen["tok-b"][0] == {"bob"}, seen
    assert seen["ops-secret"][0] == {"alice", "bob"}
    for token in TOKENS:  # a tenant's own counts and the shared gauges are there
        assert {"tangram_actions_total", "tangram_action_queue_seconds_count", "tangram_pool_capacity"} <= seen[token][1]
    assert unknown.status_code == 401


def test_the_metrics_token_must_not_be_a_tenants() -> None:
    text = '[service]\nmetrics_token = "same"\n[tenants.alice]\ntoken = "same"\n'
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.field == "service.metrics_token" and "same" not in str(info.value)
    assert parse_config('[service]\nmetrics_token_env = "OPS"\n', environ={"OPS": "s3"}).service.metrics_token == "s3"
