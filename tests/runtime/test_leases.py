"""Env leases on real sandboxes: an idle env is released after its TTL (sandbox destroyed,
reported by a log line and a record), any use renews it, and an env with a running or a
queued action never expires (its idle time counts from the end of its last action)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

import arl_tangram
from arl_tangram.client import AsyncClient
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.controller import Controller
from arl_tangram.runtime.leases import ExpiredEnv
from tests.runtime.builders import config, exec_payload, exec_spec

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
TTL_S = 0.3


@pytest.fixture
async def tg() -> AsyncIterator[AsyncClient]:
    async with arl_tangram.connect(config=config(env_idle_ttl_s=TTL_S)) as client:
        yield client


def _controller(tg: AsyncClient) -> Controller:
    return tg.transport.controller  # type: ignore[attr-defined,no-any-return]


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_an_idle_env_is_released_destroyed_and_reported(tg: AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    c = _controller(tg)
    seen: list[ExpiredEnv] = []
    c.on_env_expired.append(seen.append)
    env = await tg.create_env(memory="64MiB")
    cpu = tg.transport.runtime.agent.cpu  # type: ignore[attr-defined]
    assert env.env_id in cpu.list_sandboxes()
    with caplog.at_level(logging.INFO, logger="arl_tangram.runtime.housekeeping"):
        await _until(lambda: c.expired_env(env.env_id) is not None)
        await _until(lambda: env.env_id not in cpu.list_sandboxes())  # the sandbox is destroyed
    record = c.expired_env(env.env_id)
    assert record is not None and seen == [record] and c.expired_envs[-1] == record
    assert record.idle_s >= TTL_S and record.cause.startswith("lease_expired")
    assert any(env.env_id in r.getMessage() and "lease expired" in r.getMessage() for r in caplog.records)
    with pytest.raises(SpecError, match="env_id"):
        c.renew_env(env.env_id)
    r = await env.exec("true")  # the env is gone: a later action is refused, not hung
    assert r.outcome == "rejected"


async def test_use_and_renew_keep_an_env_alive(tg: AsyncClient) -> None:
    c = _controller(tg)
    env = await tg.create_env(memory="64MiB")
    for i in range(8):  # 1.2 s, four TTLs, in steps under one TTL
        await asyncio.sleep(TTL_S / 2)
        if i % 3 == 0:
            c.renew_env(env.env_id)
        elif i % 3 == 1:
            await env.write_file("f.txt", "x")  # a file call is a use
        else:
            assert (await env.exec("true")).ok  # so is an action
    assert c.expired_env(env.env_id) is None and (await env.read_file("f.txt")) == b"x"
    await _until(lambda: c.expired_env(env.env_id) is not None)  # left alone, it expires


async def test_running_and_queued_actions_keep_their_envs(tg: AsyncClient) -> None:
    c = _controller(tg)
    busy, waiting = await tg.create_env(memory="64MiB"), await tg.create_env(memory="64MiB")
    cores = sum(c.loop.state.spec.cpu_nodes[0].numa_cores)
    running = c.submit(exec_spec(busy.env_id, cores=cores), exec_payload("sleep 1.2"))  # holds every core
    await _until(lambda: running.started_s is not None)
    queued = c.submit(exec_spec(waiting.env_id), exec_payload("echo ran"))  # waits ~4 TTLs for a core
    assert (await c.wait(running.spec.action_id, 5.0)).ok
    result = await c.wait(queued.spec.action_id, 5.0)
    assert result.ok and result.stdout == "ran\n" and result.queue_s > 2 * TTL_S
    assert c.expired_env(busy.env_id) is None and c.expired_env(waiting.env_id) is None
    ended_s = time.monotonic()
    await _until(lambda: c.expired_env(waiting.env_id) is not None)  # idle from its action's end
    record = c.expired_env(waiting.env_id)
    assert record is not None and time.monotonic() - ended_s >= TTL_S - 0.05
    await busy.release()
