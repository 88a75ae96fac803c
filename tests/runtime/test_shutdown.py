"""``Controller.begin_shutdown``, the first moment of a stop: an env creation still pending
ends ``EnvFailedError`` (``shutting_down``), a queued action ends ``error`` /
``shutting_down`` and is journaled, a running one is stopped (``cancelled``), and new work
is refused; closing afterwards leaves every accepted action ended in the journal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arl_tangram.core.action import EnvSpec
from arl_tangram.runtime.controller import EnvFailedError
from arl_tangram.runtime.embedded import EmbeddedRuntime
from arl_tangram.runtime.journal import Journal
from tests.runtime.builders import NOOP, config, exec_payload, exec_spec, noop_spec

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
MEM = 64 << 20


def _env(env_id: str) -> EnvSpec:
    return EnvSpec(env_id, MEM, "default", "", pids_max=64, workspace_bytes=16 << 20, tmp_bytes=16 << 20)


async def test_begin_shutdown_ends_what_is_pending_at_once_and_journals_it(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    runtime = await EmbeddedRuntime.start(config(journal_path=str(path)))
    try:
        c = runtime.controller
        await c.create_env(_env("e-1"))
        cores = sum(c.loop.state.spec.cpu_nodes[0].numa_cores)
        running = c.submit(exec_spec("e-1", cores=cores, action_id="running"), exec_payload("touch up && sleep 30"))
        cpu = c.env_node("e-1").cpu
        for _ in range(500):  # its program runs (a stop before that is the kill path's own case)
            try:
                await asyncio.to_thread(cpu.read_file, "e-1", "up")
                break
            except Exception:
                await asyncio.sleep(0.02)
        queued = c.submit(noop_spec(cpu_millicores=1000, action_id="queued"), NOOP)  # behind every core
        creating = asyncio.create_task(c.create_env(_env("e-2")))
        await asyncio.sleep(0)  # its request is posted; its sandbox is not ready
        assert running.started_s is not None and queued.result is None and not creating.done()
        c.begin_shutdown()
        c.begin_shutdown()  # idempotent
        with pytest.raises(EnvFailedError, match="shutting_down"):
            await asyncio.wait_for(creating, 5)
        assert queued.result is not None and (queued.result.outcome, queued.result.cause) == ("error", "shutting_down")
        assert (await c.wait("running", 10)).outcome == "cancelled"
        with pytest.raises(EnvFailedError, match="shutting_down"):
            await c.create_env(_env("e-3"))
        with pytest.raises(RuntimeError, match="stopping"):
            c.submit(noop_spec(), NOOP)
    finally:
        await runtime.aclose()
    journal = Journal(str(path))
    try:
        ended = {r.action_id: (r.result or {}).get("cause") for r in journal.load()}
    finally:
        journal.close()
    assert set(ended) == {"running", "queued"} and ended["queued"] == "shutting_down", ended
