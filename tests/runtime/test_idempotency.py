"""Idempotent submission under a client request id, and result retention: a retried
submission never runs twice (also after its result was acknowledged, through the journal);
a result stays readable until acknowledged or its retention runs out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import arl_tangram
from arl_tangram.runtime.controller import Controller
from arl_tangram.runtime.embedded import EmbeddedRuntime
from tests.runtime.builders import NOOP, config, exec_payload, exec_spec, noop_spec

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]  # a runtime starts a real CPU manager


async def test_a_retried_request_id_returns_the_same_action_and_runs_once(tmp_path: Path) -> None:
    cfg = config(journal_path=str(tmp_path / "journal.sqlite"))
    async with arl_tangram.connect(config=cfg) as tg:
        c: Controller = tg.transport.controller  # type: ignore[attr-defined]
        env = await tg.create_env(memory="64MiB")
        append = exec_payload("echo ran >> count.txt")
        first = c.submit(exec_spec(env.env_id), append, request_id="req-1")
        again = c.submit(exec_spec(env.env_id), append, request_id="req-1")  # a retried POST, new action id
        assert again is first
        assert (await c.wait(first.spec.action_id, 10.0)).ok
        assert c.ack(first.spec.action_id) and c.get(first.spec.action_id) is None
        later = c.submit(exec_spec(env.env_id), append, request_id="req-1")  # after ack: the journaled result
        assert later.spec.action_id == first.spec.action_id and later.done.done() and later.result == first.result
        other = c.submit(exec_spec(env.env_id, tenant="other"), append, request_id="req-1")  # request ids are per tenant
        assert other.spec.action_id != first.spec.action_id
        await c.wait(other.spec.action_id, 10.0)
        assert (await env.read_file("count.txt")) == b"ran\nran\n"  # once for each tenant, never twice
        await env.release()


async def test_results_are_kept_until_acknowledged_or_their_retention_ends() -> None:
    runtime = await EmbeddedRuntime.start(config(result_retention_s=0.3))
    try:
        c = runtime.controller
        kept, acked = c.submit(noop_spec(), NOOP, request_id="r-kept"), c.submit(noop_spec(), NOOP)
        await c.wait(kept.spec.action_id, 5.0)
        await c.wait(acked.spec.action_id, 5.0)
        assert c.ack(acked.spec.action_id) and c.get(acked.spec.action_id) is None
        assert not c.ack(acked.spec.action_id)  # idempotent
        await asyncio.sleep(0.1)
        assert c.get(kept.spec.action_id) is kept  # read twice, still there
        assert c.submit(noop_spec(), NOOP, request_id="r-kept") is kept
        await asyncio.sleep(0.6)  # past retention (the sweep runs every 75 ms here)
        assert c.get(kept.spec.action_id) is None and len(c.store) == 0
    finally:
        await runtime.aclose()


async def test_an_unfinished_action_is_not_forgotten_by_ack() -> None:
    runtime = await EmbeddedRuntime.start(config())
    try:
        c = runtime.controller
        record = c.submit(noop_spec(), NOOP)
        assert not c.ack(record.spec.action_id)  # no result yet: kept
        assert (await c.wait(record.spec.action_id, 5.0)).ok and c.get(record.spec.action_id) is record
    finally:
        await runtime.aclose()
