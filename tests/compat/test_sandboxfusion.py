"""The SandboxFusion face, checked with the real ``sandbox-fusion`` client (sync and async)
and raw HTTP for the status rules: real sandboxes behind a real uvicorn on loopback."""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat

sf = pytest.importorskip("sandbox_fusion", reason="the sandbox-fusion client package is not installed")
from sandbox_fusion import RunCodeRequest, RunJupyterRequest, run_code, run_code_async, run_jupyter  # noqa: E402


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_success_exit_codes_stdin_and_timeouts(server: ServerThread) -> None:
    ok = run_code(RunCodeRequest(code="print(1)", language="python"), endpoint=server.url, max_attempts=1)
    assert ok.status == "Success" and ok.run_result is not None
    assert (ok.run_result.status, ok.run_result.return_code, ok.run_result.stdout) == ("Finished", 0, "1\n")
    assert ok.compile_result is None and ok.run_result.execution_time is not None
    bad = run_code(RunCodeRequest(code="import sys; print('x', file=sys.stderr); sys.exit(3)", language="python"), endpoint=server.url)
    assert bad.status == "Failed" and bad.run_result is not None
    assert (bad.run_result.status, bad.run_result.return_code, bad.run_result.stderr) == ("Finished", 3, "x\n")
    echo = run_code(RunCodeRequest(code="read a b; echo $((a+b))", language="bash", stdin="2 40\n"), endpoint=server.url)
    assert echo.status == "Success" and echo.run_result is not None and echo.run_result.stdout == "42\n"
    slow = run_code(RunCodeRequest(code="import time; time.sleep(30)", language="python", run_timeout=0.5), endpoint=server.url)
    assert slow.status == "Failed" and slow.run_result is not None
    assert slow.run_result.status == "TimeLimitExceeded" and slow.run_result.execution_time < 5


def test_c_and_cpp_report_the_compile_step(server: ServerThread) -> None:
    c = run_code(RunCodeRequest(code='#include <stdio.h>\nint main(){int x;scanf("%d",&x);printf("%d\\n",x*2);}', language="cpp", stdin="21"), endpoint=server.url)
    assert c.status == "Success" and c.compile_result is not None and c.compile_result.return_code == 0
    assert c.run_result is not None and c.run_result.stdout == "42\n"
    broken = run_code(RunCodeRequest(code="int main( { return 0; }", language="cpp"), endpoint=server.url)
    assert broken.status == "Failed" and broken.run_result is None
    assert broken.compile_result is not None and broken.compile_result.return_code != 0 and "error" in (broken.compile_result.stderr or "")
    raw = httpx.post(f"{server.url}/run_code", json={"code": "#include <math.h>\n#include <stdio.h>\nint main(){printf(\"%.0f\\n\", sqrt(81.0));}", "language": "c"})
    assert raw.status_code == 200 and raw.json()["run_result"]["stdout"] == "9\n"


def test_files_in_and_out_and_big_output(server: ServerThread) -> None:
    code = "data = open('in/data.txt').read()\nopen('out.txt', 'w').write(data.upper())\nprint('y' * 300000)"
    r = run_code(
        RunCodeRequest(code=code, language="python", files={"in/data.txt": b64(b"abc")}, fetch_files=["out.txt", "missing.txt"]),
        endpoint=server.url,
    )
    assert r.status == "Success" and r.run_result is not None
    assert base64.b64decode(r.files["out.txt"]) == b"ABC" and "missing.txt" not in r.files
    assert len(r.run_result.stdout or "") == 300001
    # the sandbox is reset before reuse: the next run sees none of this run's files
    after = run_code(RunCodeRequest(code="import os; print(sorted(os.listdir('.')))", language="python"), endpoint=server.url)
    assert after.run_result is not None and after.run_result.stdout == "['main.py']\n"


def test_an_unknown_language_is_a_clear_error(server: ServerThread) -> None:
    with pytest.raises(Exception, match="language"):
        run_code(RunCodeRequest(code="print 1", language="lean"), endpoint=server.url, max_attempts=1)
    raw = httpx.post(f"{server.url}/run_code", json={"code": "x", "language": "cobol"})
    assert raw.status_code == 422 and raw.json()["field"] == "language" and "python" in raw.json()["rule"]


def test_invalid_bodies_are_422_and_defaults_follow_the_server(server: ServerThread) -> None:
    assert httpx.get(f"{server.url}/v1/ping").json() == "pong"
    assert httpx.post(f"{server.url}/run_code", json={"language": "python"}).status_code == 422  # no code
    assert httpx.post(f"{server.url}/run_code", json={"code": "1", "run_timeout": -1}).status_code == 422
    bad_b64 = httpx.post(f"{server.url}/run_code", json={"code": "1", "files": {"a": "%%%"}})
    assert bad_b64.status_code == 422 and bad_b64.json()["field"] == "files[a]"
    # verl's tutorial posts only {"code"}: the language defaults to python; unknown fields are ignored
    only_code = httpx.post(f"{server.url}/run_code", json={"code": "print(7)", "extra_field": 1})
    assert only_code.status_code == 200 and only_code.json()["run_result"]["stdout"] == "7\n"


def test_a_memory_limit_is_enforced_as_a_program_failure(server: ServerThread) -> None:
    r = httpx.post(
        f"{server.url}/run_code",
        json={"code": "x = bytearray(400 << 20); x[::4096] = b'1' * len(x[::4096]); print('survived')", "memory_limit_MB": 128},
        timeout=60,
    ).json()
    assert r["status"] == "Failed", r  # the whole answer: a SandboxError names its cause
    assert r["run_result"]["stdout"] == "" and r["run_result"]["return_code"] != 0


@pytest.mark.anyio
async def test_concurrent_async_runs(server: ServerThread) -> None:
    requests = [RunCodeRequest(code=f"print({i} * {i})", language="python") for i in range(24)]
    results = await asyncio.gather(*(run_code_async(r, endpoint=server.url) for r in requests))
    assert [r.run_result.stdout for r in results if r.run_result] == [f"{i * i}\n" for i in range(24)]


def test_run_jupyter_keeps_state_across_cells_and_stops_at_an_error(server: ServerThread) -> None:
    r = run_jupyter(RunJupyterRequest(cells=["a = 6", "print(a); a * 7", "1 / 0", "print('never')"]), endpoint=server.url)
    assert r.status == "Failed" and len(r.cells) == 3
    assert r.cells[1].stdout == "6\n" and r.cells[1].display == [{"text/plain": "42"}]
    assert r.cells[2].error[0]["ename"] == "ZeroDivisionError"
    ok = run_jupyter(RunJupyterRequest(cells=["import math", "math.sqrt(16)"]), endpoint=server.url)
    assert ok.status == "Success" and ok.cells[1].display == [{"text/plain": "4.0"}]


def test_tenants_by_path_token_and_overload_is_a_retryable_504() -> None:
    needs_sandbox_host()
    with serve_compat(tokens={"tok-a": "alice"}, max_envs=1, acquire_timeout_s=0.3) as s:
        assert httpx.post(f"{s.url}/run_code", json={"code": "print(1)"}).status_code == 401
        assert httpx.post(f"{s.url}/t/wrong/run_code", json={"code": "print(1)"}).status_code == 401
        r = run_code(RunCodeRequest(code="print(5)", language="python"), endpoint=f"{s.url}/t/tok-a", max_attempts=1)
        assert r.status == "Success" and r.run_result is not None and r.run_result.stdout == "5\n"

        async def two_at_once() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"code": "import time; time.sleep(1.5)"}
                return await asyncio.gather(*(client.post(f"{s.url}/t/tok-a/run_code", json=body) for _ in range(2)))

        codes = sorted(r.status_code for r in asyncio.run(two_at_once()))
        assert codes == [200, 504]
        busy = [r for r in asyncio.run(two_at_once()) if r.status_code == 504]
        assert all(int(r.headers["Retry-After"]) >= 1 for r in busy)
        assert len(s.app.state.compat.retries) == 1  # the call answered 504: its retry goes first


def test_a_sandbox_is_reset_and_reused(server: ServerThread) -> None:
    def pool_envs() -> set[str]:
        return {e["env_id"] for e in httpx.get(f"{server.url}/v1/envs").json()["envs"] if e["env_id"].startswith("pool-")}

    code = (
        "import os\nleft = [p for p in ('mark.txt', '/tmp/mark', '/dev/shm/mark') if os.path.exists(p)]\n"
        "for p in ('mark.txt', '/tmp/mark', '/dev/shm/mark'): open(p, 'w').write('x')\nprint(left)"
    )
    before = pool_envs()
    for _ in range(5):
        r = httpx.post(f"{server.url}/run_code", json={"code": code}).json()
        assert r["run_result"]["stdout"] == "[]\n", r  # nothing of an earlier run is left
        time.sleep(0.3)  # the reset runs after the answer, off the caller's path
    assert len(pool_envs()) <= max(1, len(before))  # reused, not one new sandbox per call


def test_a_burst_beyond_the_nodes_memory_waits_for_sandboxes_and_evicts_idle_ones() -> None:
    needs_sandbox_host()
    with serve_compat() as s:
        node_mb = s.app.state.api.max_env_mem_bytes() >> 20
        third = {"code": "import time; time.sleep(0.2); print('ok')", "memory_limit_MB": node_mb // 3 - 64}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(*(client.post(f"{s.url}/run_code", json=third) for _ in range(8)))

        t0 = time.monotonic()
        assert [r.json()["run_result"]["stdout"] for r in asyncio.run(burst())] == ["ok\n"] * 8
        assert time.monotonic() - t0 < 30  # at most 3 sandboxes fit: the rest waited for them, none hung
        time.sleep(0.5)  # their resets end: up to 3 idle sandboxes hold the memory now
        big = httpx.post(f"{s.url}/run_code", json={"code": "print('big')", "memory_limit_MB": node_mb * 2 // 3}, timeout=60)
        assert big.json()["run_result"]["stdout"] == "big\n"  # idle sandboxes of another size were evicted


def test_a_sandbox_whose_reset_fails_is_retired_not_reused() -> None:
    """A run leaves a file the reset cannot remove (its directory made unwritable): the reset
    fails, the sandbox is destroyed, and the next run gets a new, clean one. One sandbox at
    most, so a dirty one going back to the pool would be the next run's."""
    needs_sandbox_host()

    def pool_envs(s: ServerThread) -> set[str]:
        return {e["env_id"] for e in httpx.get(f"{s.url}/v1/envs").json()["envs"] if e["env_id"].startswith("pool-")}

    listing = "import os\nprint(sorted(set(os.listdir('.')) - {'main.py'}))\n"  # the run's own code file
    dirty = (
        listing + "os.makedirs('locked/inner')\n"
        "open('locked/inner/f', 'w').write('x')\nos.chmod('locked/inner', 0o555)"
    )
    with serve_compat(max_envs=1, max_idle=1) as s:
        first = httpx.post(f"{s.url}/run_code", json={"code": dirty}, timeout=60).json()
        assert first["status"] == "Success" and first["run_result"]["stdout"] == "[]\n", first
        used = pool_envs(s)
        deadline = time.monotonic() + 20
        while pool_envs(s) & used and time.monotonic() < deadline:
            time.sleep(0.1)  # the reset runs after the answer, off the caller's path
        assert not pool_envs(s) & used, "the sandbox that failed its reset is still held"
        again = httpx.post(f"{s.url}/run_code", json={"code": listing}, timeout=60).json()
        assert again["run_result"]["stdout"] == "[]\n", again  # a new sandbox: nothing left over
