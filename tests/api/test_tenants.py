"""Tenants at the API: tokens map to tenants, every call needs a known token once tokens
are configured (401), and another tenant's ids are not found on any route (404, not 403),
so they are not even confirmed to exist. Same-named ids of two tenants never collide."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import TangramConfig, TenantConfig
from tests.api.conftest import controller, serving

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


@pytest.fixture
def tenant_server(sandbox_host: None) -> Iterator[ServerThread]:
    with serving(tokens=TOKENS) as s:
        yield s


def _client(server: ServerThread, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60)


async def test_every_route_needs_a_known_token(tenant_server: ServerThread) -> None:
    for token in (None, "tok-mallory"):
        async with _client(tenant_server, token) as anon:
            for method, path in [
                ("GET", "/v1/envs"), ("POST", "/v1/envs"), ("GET", "/v1/envs/x"), ("POST", "/v1/actions"),
                ("GET", "/v1/actions/x"), ("GET", "/v1/services"), ("GET", "/v1/providers"), ("GET", "/v1/status"),
                ("GET", "/metrics"),
            ]:  # fmt: skip
                r = await anon.request(method, path, json={"type": "noop"} if method == "POST" else None)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path, r.text)
            assert (await anon.get("/v1/health")).status_code == 200  # liveness needs no token


async def test_another_tenants_ids_are_not_found_on_any_route(tenant_server: ServerThread) -> None:
    async with _client(tenant_server, "tok-alice") as alice, _client(tenant_server, "tok-bob") as bob:
        env = (await alice.post("/v1/envs", json={"memory": "128MiB", "env_id": "shared-name"})).json()["env_id"]
        session = (await alice.post(f"/v1/envs/{env}/sessions", json={})).json()["session_id"]
        action = (await alice.post("/v1/actions", json={"type": "exec", "env_id": env, "command": "sleep 5"})).json()["action_id"]
        tries = [
            ("GET", f"/v1/envs/{env}", None), ("DELETE", f"/v1/envs/{env}", None), ("POST", f"/v1/envs/{env}/renew", None),
            ("GET", f"/v1/envs/{env}/files?path=a", None), ("PUT", f"/v1/envs/{env}/files?path=a", None),
            ("POST", f"/v1/envs/{env}/sessions", {}), ("DELETE", f"/v1/envs/{env}/sessions/{session}", None),
            ("POST", "/v1/actions", {"type": "exec", "env_id": env, "command": "id"}),
            ("POST", "/v1/actions", {"type": "code", "env_id": env, "code": "1"}),
            ("GET", f"/v1/actions/{action}", None), ("GET", f"/v1/actions/{action}/wait?timeout_s=0", None),
            ("POST", f"/v1/actions/{action}/cancel", None), ("DELETE", f"/v1/actions/{action}", None),
            ("GET", f"/v1/actions/{action}/events", None),
        ]  # fmt: skip
        for method, path, body in tries:
            r = await bob.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
        # bob's own env may have the same name; alice's session is still not his
        mine = (await bob.post("/v1/envs", json={"memory": "128MiB", "env_id": "shared-name"})).json()["env_id"]
        r = await bob.post("/v1/actions", json={"type": "exec", "env_id": mine, "session_id": session, "command": "id"})
        assert r.status_code == 404 and r.json()["field"] == "session_id"
        assert [e["env_id"] for e in (await bob.get("/v1/envs")).json()["envs"]] == ["shared-name"]
        # alice's things are untouched: her action still runs, her env still answers
        assert (await alice.get(f"/v1/actions/{action}")).json()["state"] in ("queued", "running")
        assert (await alice.get(f"/v1/envs/{env}")).status_code == 200
        await alice.post(f"/v1/actions/{action}/cancel")
        tenants = {r.spec.tenant for r in [controller(tenant_server).store.get(f"alice.{action}")] if r}
        assert tenants == {"alice"}  # the server set the tenant from the token


async def test_the_tenant_comes_from_the_token_never_from_the_body(tenant_server: ServerThread) -> None:
    async with _client(tenant_server, "tok-bob") as bob:
        r = await bob.post("/v1/actions", json={"type": "noop", "tenant": "alice"})
        assert r.status_code == 422 and r.json()["field"] == "tenant"
        ok = (await bob.post("/v1/actions", json={"type": "noop"}, params={"wait_s": 5})).json()
        assert controller(tenant_server).get(f"bob.{ok['action_id']}").spec.tenant == "bob"


async def test_tokens_and_limits_from_the_configuration(sandbox_host: None) -> None:
    config = TangramConfig(tenants={"carol": TenantConfig("carol", token="tok-carol", max_envs=1)})
    with serving(config) as server:
        async with _client(server, "tok-carol") as carol, _client(server, None) as anon:
            assert (await anon.get("/v1/envs")).status_code == 401
            assert (await carol.post("/v1/envs", json={"memory": "128MiB"})).status_code == 201
            over = await carol.post("/v1/envs", json={"memory": "128MiB"})
            assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1, over.text
            assert "max_envs" in over.json()["field"]


async def test_a_tenant_name_that_is_no_sandbox_id_word_still_scopes_its_ids(sandbox_host: None) -> None:
    with serving(tokens={"tok-x": "team.a/rl-job-with-a-long-name"}) as server:
        async with _client(server, "tok-x") as x:
            env = (await x.post("/v1/envs", json={"memory": "128MiB", "env_id": "e1"})).json()["env_id"]
            r = (await x.post("/v1/actions", json={"type": "exec", "env_id": env, "command": "echo ok"}, params={"wait_s": 20})).json()
            assert env == "e1" and r["result"]["stdout"] == "ok\n"
            (internal,) = controller(server).env_specs
            assert internal.startswith("t-") and internal.endswith(".e1") and len(internal) <= 64


async def test_the_sdk_over_http_with_a_token(sandbox_host: None) -> None:
    import arl_tangram
    from arl_tangram.client import HttpError

    with serving(tokens={"tok-alice": "alice"}) as server:
        async with arl_tangram.connect(server.url, token="tok-alice") as tg:
            assert (await tg.ping()).ok
            env = await tg.create_env(memory="128MiB")
            assert (await env.exec("echo $TANGRAM_DOP")).stdout == "1\n"
            assert controller(server).env_specs and all(e.startswith("alice.") for e in controller(server).env_specs)
        assert not controller(server).env_specs  # closing the client released the env it held
        with pytest.raises(HttpError, match="401"):
            await arl_tangram.connect(server.url, token="tok-wrong")
