"""The edge (api/edge.py) on a real server: a credential is checked before a body is read,
bodies past their route's cap are 413 naming the setting, and no exception reaches uvicorn
(a 500 keeps the connection and carries no traceback)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from arl_tangram.api import create_app
from arl_tangram.api.compat import mount_compat
from arl_tangram.api.edge import BodyLimits
from arl_tangram.api.server import ServerThread
from arl_tangram.bench.service import chunked_until_answered

pytestmark = pytest.mark.usefixtures("sandbox_host")
TOKEN = "tok-edge-a"


@pytest.fixture
def guarded() -> Iterator[ServerThread]:
    """A server with a token and the compat faces."""
    app = create_app(None, tokens={TOKEN: "team-a"})
    mount_compat(app)
    server = ServerThread(app).start()
    try:
        yield server
    finally:
        server.stop()


def bytes_read(server: ServerThread) -> int:
    return int(server.app.state.body_meter.bytes_read)


def test_a_body_without_a_credential_is_refused_before_it_is_read(guarded: ServerThread) -> None:
    before = bytes_read(guarded)
    form = {"content-type": "multipart/form-data; boundary=xyz"}
    status, sent = chunked_until_answered(guarded.url, "/swerex/env-x/upload", form, 300 << 20)
    assert status == 401
    json_type = {"content-type": "application/json"}
    status_native, _ = chunked_until_answered(guarded.url, "/v1/envs", json_type, 300 << 20)
    assert status_native == 401
    status_bad_key, _ = chunked_until_answered(guarded.url, "/swerex/env-x/upload", {**form, "x-api-key": "wrong"}, 300 << 20)
    assert status_bad_key == 401
    assert bytes_read(guarded) - before <= 64 << 10, (bytes_read(guarded) - before, sent)
    # the same body with the token is read (and then refused for what it is: no such env)
    ok = httpx.post(f"{guarded.url}/v1/envs", content=b'{"memory": 1}', headers={**json_type, "authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 422 and bytes_read(guarded) > before
    assert httpx.get(f"{guarded.url}/v1/health").status_code == 200


def test_bodies_past_their_route_cap_are_413_naming_the_setting(sandbox_host: None) -> None:
    limits = BodyLimits(body_bytes=8 << 10, file_bytes=128 << 10, upload_bytes=8 << 10)
    server = ServerThread(create_app(None, body_limits=limits)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            env_id = c.post("/v1/envs", json={"memory": "128MiB"}).json()["env_id"]
            before = bytes_read(server)
            r = c.post("/v1/actions", content=b" " * (9 << 10), headers={"content-type": "application/json"})
            assert r.status_code == 413, r.text
            assert r.json()["field"] == "body" and "service.max_body_bytes" in r.json()["rule"]
            assert bytes_read(server) == before  # a declared length over the cap: nothing read
            status, _ = chunked_until_answered(server.url, "/v1/actions", {"content-type": "application/json"}, 4 << 20)
            assert status == 413
            # cut off at the cap: at most one more receive message (uvicorn's buffer) than the cap
            assert bytes_read(server) - before <= (8 << 10) + (256 << 10)
            # a file PUT has its own, larger cap
            data = bytes(range(256)) * 400  # 100 KiB: over the JSON cap, under the file cap
            assert c.put(f"/v1/envs/{env_id}/files", params={"path": "f.bin"}, content=data).status_code == 204
            assert c.get(f"/v1/envs/{env_id}/files", params={"path": "f.bin"}).content == data
            r = c.put(f"/v1/envs/{env_id}/files", params={"path": "g.bin"}, content=data * 2)
            assert r.status_code == 413 and "service.max_file_body_bytes" in r.json()["rule"]
            assert c.delete(f"/v1/envs/{env_id}").status_code == 204
    finally:
        server.stop()


def request_on(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"content-type": "application/json"} if data is not None else {})
    response = conn.getresponse()
    text = response.read()
    assert response.getheader("connection") != "close", (method, path, response.status)
    return response.status, json.loads(text) if text.startswith(b"{") else {}


def test_file_session_and_json_errors_are_4xx_naming_the_field_on_one_connection(sandbox_host: None) -> None:
    app = create_app(None)
    mount_compat(app)
    server = ServerThread(app).start()
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        status, env = request_on(conn, "POST", "/v1/envs", {"memory": "128MiB"})
        assert status == 201
        sock = conn.sock
        files = f"/v1/envs/{env['env_id']}/files?path="
        cases = [
            ("GET", files + "missing.txt", None, None, 404, "path"),
            ("GET", files + "/tmp", None, None, 409, "path"),
            ("PUT", files + ".", None, b"x", 409, "path"),
            ("PUT", files + "/etc/passwd", None, b"x", 422, "path"),
            ("POST", f"/v1/envs/{env['env_id']}/sessions", {"cwd": "/workspace/missing"}, None, 409, "cwd"),
            ("POST", f"/v1/envs/{env['env_id']}/sessions", {"cwd": "/etc"}, None, 422, "cwd"),
            ("POST", "/v1/envs", {"env_id": env["env_id"]}, None, 409, "env_id"),
            ("POST", f"/swerex/{env['env_id']}/execute", None, b"[" * 10000 + b"]" * 10000, 422, "body"),
            ("POST", "/v1/envs", None, b"[" * 10000 + b"]" * 10000, 422, "body"),
            # over the small-body size: parsed by the JSON worker, same rule
            ("POST", "/v1/envs", None, b"[" * 300 + b'"' + b"p" * (300 << 10) + b'"' + b"]" * 300, 422, "body"),
            ("POST", f"/swerex/{env['env_id']}/execute", [1], None, 422, "body"),
        ]
        for method, path, body, raw, want, field in cases:
            status, answer = request_on(conn, method, path, body, raw)
            assert (status, answer.get("field")) == (want, field), (method, path[:60], status, answer)
            assert answer.get("rule"), answer
        assert "nest at most 200 levels" in request_on(conn, "POST", "/v1/envs", None, b"[" * 10000 + b"]" * 10000)[1]["rule"]
        assert conn.sock is sock  # every answer kept the connection
        assert request_on(conn, "DELETE", f"/v1/envs/{env['env_id']}")[0] == 204
    finally:
        conn.close()
        server.stop()


class Unexpected(Exception):
    """No handler knows it: the edge's last line answers it."""


def test_an_unexpected_error_is_a_500_without_internals_and_keeps_the_connection(sandbox_host: None) -> None:
    app = create_app(None)

    @app.get("/test-only/boom")
    async def boom() -> None:
        raise Unexpected("secret detail /etc/shadow")

    server = ServerThread(app).start()
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        assert request_on(conn, "GET", "/v1/health")[0] == 200
        sock = conn.sock
        status, body = request_on(conn, "GET", "/test-only/boom")
        assert status == 500 and body["error"] == "internal error: Unexpected"
        assert "secret" not in json.dumps(body) and "Traceback" not in json.dumps(body)
        assert request_on(conn, "GET", "/v1/health")[0] == 200 and conn.sock is sock
        status, _ = request_on(conn, "OPTIONS", "/v1/envs")
        conn.request("OPTIONS", "/v1/envs")
        response = conn.getresponse()
        response.read()
        assert response.status == 405 and response.getheader("allow") == "GET, POST"
    finally:
        conn.close()
        server.stop()


def test_large_json_bodies_reach_the_routes_through_the_json_worker(server: ServerThread) -> None:
    big = {"type": "service", "service": "no/such-service", "request": {"texts": ["x" * (1 << 20)] * 3}}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/v1/actions", json=big)
        assert r.status_code in (404, 422) and r.json()["field"] == "service", r.text
        r = c.post("/v1/envs", json={"memory": "128MiB", "trajectory_id": "t" * (1 << 20)})
        assert r.status_code == 422 and r.json()["field"] == "trajectory_id", r.text
    assert server.app.state.json_workers.num_parsed == 2
