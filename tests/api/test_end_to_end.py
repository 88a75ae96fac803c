"""End to end over real HTTP with real sandboxes: envs, exec, code, files, sessions, cancel
of a queued and of a running action, waits that time out, the event stream, a client that
disconnects mid-wait, idempotent resubmission, and 4xx bodies that name the field and rule."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.api.conftest import controller

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]


async def _env(http: httpx.AsyncClient, **body: Any) -> str:
    r = await http.post("/v1/envs", json={"memory": "128MiB", **body})
    assert r.status_code == 201, r.text
    return str(r.json()["env_id"])


async def _run(http: httpx.AsyncClient, body: dict[str, Any], wait_s: float = 30) -> dict[str, Any]:
    r = await http.post("/v1/actions", json=body, params={"wait_s": wait_s})
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_env_exec_code_files_and_sessions(http: httpx.AsyncClient) -> None:
    env = await _env(http)
    assert env.startswith("env-") and len(env) == 36  # uuid4-based: not guessable
    assert (await http.put(f"/v1/envs/{env}/files", params={"path": "sol.py"}, content=b"print(2 + 3)\n")).status_code == 204
    r = await _run(http, {"type": "exec", "env_id": env, "command": ["python3", "sol.py"]})
    assert r["state"] == "done" and r["result"]["outcome"] == "succeeded" and r["result"]["stdout"] == "5\n"
    assert r["result"]["exec_s"] > 0 and r["started_at"] >= r["submitted_at"]
    code = await _run(http, {"type": "code", "env_id": env, "code": "open('out.txt', 'w').write('kept')"})
    assert code["result"]["outcome"] == "succeeded", code
    assert (await http.get(f"/v1/envs/{env}/files", params={"path": "out.txt"})).content == b"kept"
    failed = await _run(http, {"type": "exec", "env_id": env, "command": "exit 3"})
    assert (failed["result"]["outcome"], failed["result"]["exit_code"]) == ("failed", 3)
    s = await http.post(f"/v1/envs/{env}/sessions", json={})
    session_id = s.json()["session_id"]
    await _run(http, {"type": "exec", "env_id": env, "session_id": session_id, "command": "cd /tmp && export X=7"})
    r = await _run(http, {"type": "exec", "env_id": env, "session_id": session_id, "command": "echo $X $(pwd)"})
    assert r["result"]["stdout"].split() == ["7", "/tmp"] and r["kind"] == "session"
    assert (await http.delete(f"/v1/envs/{env}/sessions/{session_id}")).status_code == 204
    listed = (await http.get("/v1/envs")).json()["envs"]
    assert [e["env_id"] for e in listed] == [env] and listed[0]["ready"]
    assert (await http.delete(f"/v1/envs/{env}")).status_code == 204
    assert (await http.get(f"/v1/envs/{env}")).status_code == 404


async def test_cancel_a_queued_and_a_running_action(http: httpx.AsyncClient) -> None:
    env = await _env(http)
    running = await _run(http, {"type": "exec", "env_id": env, "command": "sleep 30", "cpu": {"min": 2, "max": 2}}, wait_s=0)
    queued = await _run(http, {"type": "exec", "env_id": env, "command": "sleep 30", "cpu": {"min": 2, "max": 2}}, wait_s=0)
    for _ in range(100):  # the first takes both cores, the second waits for them
        if (await http.get(f"/v1/actions/{running['action_id']}")).json()["state"] == "running":
            break
        await asyncio.sleep(0.05)
    assert (await http.get(f"/v1/actions/{queued['action_id']}")).json()["state"] == "queued"
    for a in (queued, running):
        c = await http.post(f"/v1/actions/{a['action_id']}/cancel")
        assert c.status_code == 202
    for a in (queued, running):
        done = (await http.get(f"/v1/actions/{a['action_id']}/wait", params={"timeout_s": 20})).json()
        assert done["state"] == "done" and done["result"]["outcome"] == "cancelled", done
    assert (await http.delete(f"/v1/actions/{queued['action_id']}")).status_code == 204  # ack
    assert (await http.get(f"/v1/actions/{queued['action_id']}")).status_code == 404


async def test_a_wait_that_times_out_answers_with_the_state(http: httpx.AsyncClient) -> None:
    env = await _env(http)
    a = await _run(http, {"type": "exec", "env_id": env, "command": "sleep 2; echo ok"}, wait_s=0)
    t0 = time.monotonic()
    r = (await http.get(f"/v1/actions/{a['action_id']}/wait", params={"timeout_s": 0.3})).json()
    assert 0.25 < time.monotonic() - t0 < 1.5 and r["state"] in ("queued", "running") and r["result"] is None
    r = (await http.get(f"/v1/actions/{a['action_id']}/wait", params={"timeout_s": 20})).json()
    assert r["result"]["stdout"] == "ok\n"


async def _sse(stream: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """(event name, decoded JSON data) of each server-sent event."""
    event = ""
    async for line in stream.aiter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, httpx.Response(200, content=line[6:]).json()


async def test_the_event_stream_sends_transitions_then_the_result(http: httpx.AsyncClient) -> None:
    env = await _env(http)
    a = await _run(http, {"type": "exec", "env_id": env, "command": "sleep 0.5; echo streamed"}, wait_s=0)
    states = []
    async with http.stream("GET", f"/v1/actions/{a['action_id']}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        async for event, view in _sse(stream):
            if event == "state":
                states.append(view["state"])
    assert states[-1] == "done" and "running" in states and view["result"]["stdout"] == "streamed\n"
    assert states == sorted(states, key=["queued", "running", "done"].index)


async def test_the_event_stream_carries_output_while_the_action_runs(http: httpx.AsyncClient) -> None:
    env = await _env(http)
    command = "echo first; echo oops >&2; sleep 1.5; echo second"
    a = await _run(http, {"type": "exec", "env_id": env, "command": command}, wait_s=0)
    chunks: list[tuple[str, str, str]] = []  # (stream, text, the action's state when it arrived)
    async with http.stream("GET", f"/v1/actions/{a['action_id']}/events") as stream:
        async for event, out in _sse(stream):
            if event == "output":
                now = (await http.get(f"/v1/actions/{a['action_id']}")).json()["state"]
                chunks.append((out["stream"], out["text"], now))
    stdout = "".join(text for stream_name, text, _ in chunks if stream_name == "stdout")
    assert stdout == "first\nsecond\n" and ("stderr", "oops\n") in [(s, t) for s, t, _ in chunks]
    first = next(c for c in chunks if "first" in c[1])
    assert first[2] == "running"  # streamed live, not replayed from the result


async def test_a_client_that_disconnects_mid_wait_loses_nothing(server: ServerThread) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        env = await _env(http)
    body = {"type": "exec", "env_id": env, "command": "sleep 1; echo finished", "action_id": "gone-client-1"}
    async with httpx.AsyncClient(base_url=server.url, timeout=0.3) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post("/v1/actions", json=body, params={"wait_s": 30})
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        r = (await http.get("/v1/actions/gone-client-1/wait", params={"timeout_s": 20})).json()
        assert r["result"]["outcome"] == "succeeded" and r["result"]["stdout"] == "finished\n"
        again = (await http.get("/v1/actions/gone-client-1")).json()  # still readable until acknowledged
        assert again["result"] == r["result"]


async def test_a_retried_post_with_the_same_idempotency_key_runs_once(http: httpx.AsyncClient, server: ServerThread) -> None:
    env = await _env(http)
    body = {"type": "exec", "env_id": env, "command": "echo x >> runs.txt"}
    first = await http.post("/v1/actions", json=body, params={"wait_s": 20}, headers={"Idempotency-Key": "k-1"})
    second = await http.post("/v1/actions", json=body, params={"wait_s": 20}, headers={"Idempotency-Key": "k-1"})
    assert first.json()["action_id"] == second.json()["action_id"]
    assert (await http.get(f"/v1/envs/{env}/files", params={"path": "runs.txt"})).content == b"x\n"
    dup = await http.post("/v1/actions", json={**body, "action_id": first.json()["action_id"]})
    assert dup.status_code == 409 and dup.json()["field"] == "action_id"


@pytest.mark.parametrize(
    ("path", "body", "field", "rule"),
    [
        ("/v1/envs", {"memory": "lots"}, "memory", "String should match pattern"),
        ("/v1/envs", {"memory": "100TiB"}, "memory", "must fit one node's memory"),
        ("/v1/envs", {"image": "Not A Reference"}, "image", "must be 'host'"),
        ("/v1/envs", {"pids_max": 1}, "pids_max", "greater than or equal to 8"),
        ("/v1/actions", {"type": "teleport"}, "type", "does not match any of the expected tags"),
        ("/v1/actions", {"type": "exec", "env_id": "e", "command": ""}, "command", "at least 1 character"),
        ("/v1/actions", {"type": "exec", "env_id": "bad id/", "command": "x"}, "env_id", "String should match pattern"),
        ("/v1/actions", {"type": "noop", "timeout_s": -1}, "timeout_s", "greater than 0"),
        ("/v1/actions", {"type": "noop", "tenant": "root"}, "tenant", "Extra inputs are not permitted"),
        ("/v1/actions", {"type": "service", "service": "reward/none"}, "service", "must name one of this tenant's"),
        ("/v1/services", {"name": "m", "handler": "score", "folder": "/nonexistent"}, "folder", "must be a model folder"),
    ],
)
async def test_bad_input_gets_a_4xx_naming_the_field_and_the_rule(
    http: httpx.AsyncClient, server: ServerThread, path: str, body: dict[str, Any], field: str, rule: str
) -> None:
    r = await http.post(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["field"] == field and rule in r.json()["rule"], r.json()
    assert len(controller(server).store) == 0  # nothing was queued


async def test_elastic_bounds_are_checked_by_the_core_rules(http: httpx.AsyncClient) -> None:
    env = await _env(http)
    r = await http.post("/v1/actions", json={"type": "exec", "env_id": env, "command": "true", "cpu": {"min": 3, "max": 2}})
    assert r.status_code == 422 and r.json()["field"] == "cpu.min" and "cpu.max" in r.json()["rule"]
