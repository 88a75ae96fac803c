"""Deadlines through the SDK and the HTTP body (issue 26), on real sandboxes: an action that
can no longer start by its ``deadline_s`` (its ``timeout_s`` counted) is not run: its result
is ``rejected`` with cause ``deadline:`` (``deadline_missed``), soon after its latest start,
on both transports; a bad ``deadline_s`` is a ``SpecError`` (SDK) or a 422 (HTTP) naming it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from arl_tangram.client import AsyncClient, Elastic, SpecError
from tests.client.conftest import controller_of, serving

pytestmark = [pytest.mark.usefixtures("sandbox_host")]


@pytest.mark.anyio
async def test_an_action_that_cannot_start_in_time_is_rejected_deadline(tg: AsyncClient) -> None:
    cores = sum(controller_of(tg).loop.state.spec.cpu_nodes[0].numa_cores)
    busy, late = await tg.create_env(memory="64MiB"), await tg.create_env(memory="64MiB")
    hold = asyncio.create_task(busy.exec("sleep 2", cpu=Elastic(cores, cores), timeout_s=10))
    await asyncio.sleep(0.3)  # every core of the node granted to ``hold``
    t0 = time.monotonic()
    r = await late.exec("echo ran", timeout_s=1.0, deadline_s=1.5)  # must start within 0.5 s
    assert r.deadline_missed and r.outcome == "rejected" and r.stdout == "", (r.outcome, r.cause)
    assert time.monotonic() - t0 < 1.5  # answered at its latest start, not after the blocker
    assert (await hold).ok
    again = await late.exec("echo ran", timeout_s=1.0, deadline_s=1.5)  # nothing in the way now
    assert again.ok and not again.deadline_missed and again.stdout == "ran\n"
    with pytest.raises(SpecError, match="deadline_s"):
        await late.exec("true", deadline_s=-1.0)
    await busy.release()
    await late.release()


def test_a_bad_http_deadline_is_a_422_naming_it() -> None:
    with serving() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        env = http.post("/v1/envs", json={"memory": "64MiB"}).json()["env_id"]
        for bad in (0, -1.0, 1e9, "soon", True):
            r = http.post("/v1/actions", json={"type": "exec", "env_id": env, "command": "true", "deadline_s": bad})
            assert r.status_code == 422 and "deadline_s" in r.text, (bad, r.status_code, r.text[:200])
        ok = http.post("/v1/actions", json={"type": "exec", "env_id": env, "command": "true", "deadline_s": 30})
        assert ok.status_code == 201, ok.text
        http.delete(f"/v1/envs/{env}")
