"""``[sandboxfusion] warm_envs``: each tenant's code sandboxes are created before the server
listens, and the first calls borrow them instead of creating their own (real sandboxes,
real uvicorn on loopback)."""

from __future__ import annotations

import httpx

from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


def _sandboxes(server: ServerThread) -> int:
    return len(server.app.state.api.runtime.agent.cpu.list_sandboxes())


def _idle(server: ServerThread, tenant: str, mem_bytes: int) -> int:
    pool = server.app.state.compat.pool
    bucket = pool.buckets.get((tenant, mem_bytes, "host"))
    return len(bucket.idle) if bucket is not None else 0


def test_warm_sandboxes_exist_before_the_first_call_and_serve_it() -> None:
    needs_sandbox_host()
    with serve_compat(tokens=TOKENS, max_envs=4, max_idle=3, warm_envs=2) as server:
        # start-up ended (the server listens): two per tenant, at the default 1 GiB
        assert _sandboxes(server) == 4
        assert _idle(server, "alice", 1 << 30) == _idle(server, "bob", 1 << 30) == 2
        # verl's memory_limit_MB (1024) and the face's default (-1) both borrow a warm one
        for mb in (1024, -1):
            r = httpx.post(f"{server.url}/t/tok-alice/run_code", json={"code": "print(6 * 7)", "language": "python", "memory_limit_MB": mb}, timeout=60)
            assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "42\n", r.text
        assert _sandboxes(server) == 4  # nothing was created for them
        # another size is another bucket: made on demand, as before
        r = httpx.post(f"{server.url}/t/tok-bob/run_code", json={"code": "print(1)", "language": "python", "memory_limit_MB": 256}, timeout=60)
        assert r.status_code == 200, r.text
        assert _sandboxes(server) == 5


def test_no_warm_sandboxes_by_default() -> None:
    needs_sandbox_host()
    with serve_compat(max_envs=4, max_idle=4) as server:
        assert server.app.state.compat_settings.warm_envs == 0
        assert _sandboxes(server) == 0
