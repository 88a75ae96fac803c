"""The E2B face, driven by the unchanged ``e2b`` SDK (pinned 2.63.0) through
``E2B_API_URL`` / ``E2B_SANDBOX_URL`` / ``E2B_API_KEY`` against ``serve`` on 127.0.0.1:
commands (exit codes, live stdout/stderr callbacks, timeout, envs, cwd, background + kill,
per-action cores), files, the sandbox's time to live against the idle lease, list/kill,
tenants by key, and errors in the shapes the SDK turns into its own exceptions. The
template is the host root here; tests/images/test_e2b_image.py runs an image."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import TangramConfig
from arl_tangram.runtime.config_e2b import E2bConfig
from arl_tangram.runtime.config_service import ServiceSettings
from tests.compat.conftest import needs_sandbox_host, serve_compat

pytest.importorskip("e2b", reason="the e2b client package is not installed")
from e2b import (  # noqa: E402
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    TimeoutException,
)

KEY_A, KEY_B = "e2b_" + "a" * 40, "e2b_" + "b" * 40
IDLE_TTL_S = 0.8  # the runtime's idle lease here: shorter than the sandboxes' timeouts
CONFIG = TangramConfig(
    service=ServiceSettings(env_idle_ttl_s=IDLE_TTL_S),
    e2b=E2bConfig(mem_bytes=256 << 20, templates={"base": "host"}, warm=1),
)


@pytest.fixture(scope="module")
def e2b_server() -> Iterator[ServerThread]:
    needs_sandbox_host()
    with serve_compat(CONFIG, tokens={KEY_A: "alice", KEY_B: "bob"}) as s:
        yield s


@pytest.fixture
def api(e2b_server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"{e2b_server.url}/e2b"
    for name, value in (("E2B_API_URL", url), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", KEY_A)):
        monkeypatch.setenv(name, value)
    return url


@pytest.fixture
def sandbox(api: str) -> Iterator[Sandbox]:
    sb = Sandbox.create("base", timeout=120)
    yield sb
    sb.kill()


def test_commands_run_as_actions_with_exit_codes_envs_cwd_and_cores(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo out; echo err >&2; pwd; echo $FOO $TANGRAM_DOP", envs={"FOO": "bar"})
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\n/workspace\nbar 1\n", "err\n")
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo nope >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stderr) == (3, "nope\n")
    # a cpu hint rides in the command's envs: the action is granted that many cores
    assert sandbox.commands.run("nproc; echo $TANGRAM_DOP", envs={"TANGRAM_CPU": "2"}).stdout == "2\n2\n"


def test_output_reaches_the_callbacks_while_the_command_runs(sandbox: Sandbox) -> None:
    seen: list[tuple[str, str, float]] = []
    t0 = time.monotonic()
    r = sandbox.commands.run(
        "echo first; echo warn >&2; sleep 1; echo last",
        on_stdout=lambda s: seen.append(("out", s, time.monotonic() - t0)),
        on_stderr=lambda s: seen.append(("err", s, time.monotonic() - t0)),
    )  # fmt: skip
    done_s = time.monotonic() - t0
    assert [(k, s) for k, s, _ in seen] in ([("out", "first\n"), ("err", "warn\n"), ("out", "last\n")], [("err", "warn\n"), ("out", "first\n"), ("out", "last\n")])
    assert seen[0][2] < done_s - 0.5, "the first line must arrive before the command ends"
    assert r.stdout == "first\nlast\n"


def test_a_command_past_its_timeout_is_killed_and_raises_timeout(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    while sandbox.commands.list() and time.monotonic() - t0 < 10:
        time.sleep(0.05)  # its action ends at the same deadline (a kill takes a moment)
    assert sandbox.commands.list() == [] and time.monotonic() - t0 < 10


def test_background_command_listed_connected_and_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("echo started; touch /tmp/mark; sleep 30", background=True)
    deadline = time.monotonic() + 10
    while not sandbox.files.exists("/tmp/mark") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.pid for p in sandbox.commands.list()] == [handle.pid]
    again = sandbox.commands.connect(handle.pid)
    t0 = time.monotonic()
    assert sandbox.commands.kill(handle.pid)
    with pytest.raises(CommandExitException) as killed:
        again.wait()
    assert killed.value.stdout == "started\n" and time.monotonic() - t0 < 10
    assert not sandbox.commands.kill(handle.pid)  # gone: the SDK's False for NOT_FOUND
    with pytest.raises(CommandExitException):
        handle.wait()


def test_files_write_read_list_make_dir_remove_exists(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/a.txt", "hello")
    assert (info.name, info.path) == ("a.txt", "/workspace/notes/a.txt")
    sandbox.files.write("/tmp/b.bin", b"\x00\x01")
    assert sandbox.files.read("notes/a.txt") == "hello"
    assert sandbox.files.read("/tmp/b.bin", format="bytes") == b"\x00\x01"
    assert sandbox.files.make_dir("notes/sub") is True
    assert sandbox.files.make_dir("notes/sub") is False  # already there
    listed = sandbox.files.list("/workspace/notes")
    assert [(e.name, e.type.value, e.path) for e in listed] == [("a.txt", "file", "/workspace/notes/a.txt"), ("sub", "dir", "/workspace/notes/sub")]
    assert listed[0].size == 5
    assert sandbox.files.exists("notes/a.txt") and not sandbox.files.exists("notes/none")
    sandbox.files.remove("notes")
    assert not sandbox.files.exists("notes/a.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read("notes/a.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.list("/workspace/missing")


def test_timeout_is_a_ttl_that_wins_over_the_idle_lease(api: str) -> None:
    # a TTL well past the steps before ``set_timeout`` (CI once took over 2 s for them)
    sb = Sandbox.create("base", timeout=5)
    time.sleep(2 * IDLE_TTL_S)  # idle past the lease: still alive, the TTL rules
    assert sb.commands.run("echo alive").stdout == "alive\n"
    background = sb.commands.run("sleep 30", background=True)
    sb.set_timeout(3)  # moved: now + 3 s
    end_s = time.monotonic() + 3
    assert abs(sb.get_info().end_at.timestamp() - time.time() - 3) < 1
    time.sleep(max(0.0, end_s - time.monotonic() - 0.8))
    assert sb.is_running()
    with pytest.raises(CommandExitException):
        background.wait()  # killed at the TTL's end although it was running
    assert time.monotonic() >= end_s - 0.3
    with pytest.raises(NotFoundException):
        sb.get_info()
    gone = httpx.get(f"{api}/sandboxes/{sb.sandbox_id}", headers={"X-API-Key": KEY_A})
    assert gone.status_code == 404 and "timeout (time to live) ran out at" in gone.json()["message"]  # like an expired lease
    assert not sb.kill()


def test_list_kill_and_a_second_tenant_sees_nothing(api: str, sandbox: Sandbox) -> None:
    mine = Sandbox.create("base", timeout=60, metadata={"run": "r1"})
    try:
        ids = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert {sandbox.sandbox_id, mine.sandbox_id} <= ids
        assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"run": "r1"})).next_items()] == [mine.sandbox_id]
        assert Sandbox.list(api_key=KEY_B).next_items() == []
        with pytest.raises(NotFoundException):
            Sandbox.connect(mine.sandbox_id, api_key=KEY_B)
        assert Sandbox.kill(mine.sandbox_id, api_key=KEY_B) is False  # type: ignore[call-arg, misc]
        assert mine.commands.run("true").exit_code == 0  # untouched
    finally:
        assert mine.kill() is True
    assert mine.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}
    with pytest.raises(NotFoundException):
        mine.commands.run("true")


def test_bad_input_gets_e2b_statuses_the_sdk_raises(api: str, sandbox: Sandbox) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", api_key="e2b_" + "c" * 40)
    with pytest.raises(SandboxException, match="templateID") as bad:
        Sandbox.create("no-such-alias")
    assert bad.value.status_code == 400  # type: ignore[attr-defined]
    with pytest.raises(SandboxException, match="timeout") as negative:
        Sandbox.create("base", timeout=-5)
    assert negative.value.status_code == 400  # type: ignore[attr-defined]
    with pytest.raises(NotFoundException):
        Sandbox.connect("i" + "0" * 20)
    stranger = Sandbox.connect(sandbox.sandbox_id)  # the same key: a second handle works
    assert stranger.commands.run("echo ok").stdout == "ok\n"
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "wrong", "Content-Type": "application/json"}
    r = httpx.post(f"{api}/process.Process/List", content=b"{}", headers=headers)
    assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")


def test_the_binary_proto_codec_streams_too(api: str, sandbox: Sandbox) -> None:
    from e2b.envd.process import process_pb as pb

    from arl_tangram.api.compat.e2b.connect import envelope

    start = pb.StartRequest(process=pb.ProcessConfig(cmd="/bin/bash", args=["-c", "echo hi; exit 4"]))
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or "",
        "Content-Type": "application/connect+proto",
    }  # fmt: skip
    r = httpx.post(f"{api}/process.Process/Start", content=envelope(start.to_binary()), headers=headers, timeout=30)
    assert r.headers["content-type"] == "application/connect+proto"
    body, events = r.content, []
    while body:
        flags, size = body[0], int.from_bytes(body[1:5], "big")
        if not flags & 2:
            events.append(pb.StartResponse.from_binary(body[5 : 5 + size]).event.event)
        body = body[5 + size :]
    assert [e.field for e in events] == ["start", "data", "end"]
    assert (events[1].value.output.value, events[2].value.exit_code) == (b"hi\n", 4)


def test_pause_stops_commands_and_the_clock_resume_restarts_them(api: str, sandbox: Sandbox) -> None:
    sandbox.pause()
    assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"
    with pytest.raises(SandboxException):
        sandbox.commands.run("true", request_timeout=5)
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
    assert resumed.get_info().state.value == "running"
    assert resumed.commands.run("echo back").stdout == "back\n"




def test_a_create_takes_a_ready_spare_of_its_kind(api: str, e2b_server: ServerThread) -> None:
    first = Sandbox.create("base", timeout=60, metadata={"memory": "192MiB"})  # a kind of its own
    native = httpx.Client(base_url=e2b_server.url, headers={"Authorization": f"Bearer {KEY_A}"})
    try:
        deadline, spare = time.monotonic() + 30, None
        while spare is None and time.monotonic() < deadline:  # the spare is an env of the tenant
            ids = {e["env_id"] for e in native.get("/v1/envs").json()["envs"] if e["mem_bytes"] == 192 << 20}
            spare = next(iter(ids - {first.sandbox_id}), None)
            time.sleep(0.05)
        assert spare is not None
        second = Sandbox.create("base", timeout=60, metadata={"memory": "192MiB"})
        try:
            assert second.sandbox_id == spare  # taken, not started
            assert second.commands.run("echo ok").stdout == "ok\n"
        finally:
            second.kill()
    finally:
        first.kill()
        native.close()


def test_the_e2b_table_is_read_and_checked() -> None:
    from arl_tangram.runtime.config import parse_config
    from arl_tangram.runtime.config_reader import ConfigError

    config = parse_config('[e2b]\nprefix = "/sbx"\ncpu = "1-4"\nmemory = "512MiB"\nwarm = 3\n[e2b.templates]\npy = "127.0.0.1:5000/py:3"\n')
    assert (config.e2b.prefix, config.e2b.cpu, config.e2b.mem_bytes, config.e2b.warm) == ("/sbx", (1, 4), 512 << 20, 3)
    assert dict(config.e2b.templates) == {"py": "127.0.0.1:5000/py:3"}
    for text, field in (('prefix = "sbx/"', "e2b.prefix"), ('cpu = "4-1"', "e2b.cpu"), ("warm = -1", "e2b.warm"), ("colour = 1", "e2b.colour")):
        with pytest.raises(ConfigError) as bad:
            parse_config(f"[e2b]\n{text}\n")
        assert bad.value.field == field


def test_raw_routes_the_sdk_does_not_call_v1_list_refreshes_and_the_host_form(api: str, sandbox: Sandbox) -> None:
    key = {"X-API-Key": KEY_A}
    assert sandbox.sandbox_id in {s["sandboxID"] for s in httpx.get(f"{api}/sandboxes", headers=key).json()}
    assert httpx.post(f"{api}/sandboxes/{sandbox.sandbox_id}/refreshes", json={"duration": 100}, headers=key).status_code == 204
    assert httpx.post(f"{api}/sandboxes/{sandbox.sandbox_id}/refreshes", json={"duration": -1}, headers=key).status_code == 400
    token = {"X-Access-Token": sandbox._envd_access_token or "", "Content-Type": "application/json"}
    by_host = httpx.post(f"{api}/process.Process/List", content=b"{}", headers={**token, "Host": f"49983-{sandbox.sandbox_id}.tangram.local"})
    assert (by_host.status_code, by_host.json()) == (200, {})
    other_port = httpx.post(f"{api}/process.Process/List", content=b"{}", headers={**token, "E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"})
    assert (other_port.status_code, other_port.json()["code"]) == (503, "unavailable")
