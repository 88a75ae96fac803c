"""The Ray backend without a Ray cluster: the package imports no ray, the local managers
satisfy the agent's ports, and the heartbeat declares a silent node lost exactly once,
posting ``NodeLost`` only for the node ids the core knows; a node lost for silence is still
pinged, comes back when it answers and is given up when it stays silent."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.agent.node import NodeAgent
from arl_tangram.agent.ports import ApiPort, CpuPort, GpuPort
from arl_tangram.core.events import NodeLost
from arl_tangram.core.topology import ClusterSpec, CpuNodeSpec


def test_importing_the_backend_imports_no_ray() -> None:
    code = (
        "import sys, arl_tangram.backends, arl_tangram.backends.ray, arl_tangram.agent.node\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_port_methods_exist_on_the_managers() -> None:
    """The ports name only methods the real managers have (mypy checks the signatures)."""
    from arl_tangram.managers.api.manager import ApiManager
    from arl_tangram.managers.cpu.manager import CpuManager

    for port, manager in ((CpuPort, CpuManager), (ApiPort, ApiManager)):
        missing = [n for n in dir(port) if not n.startswith("_") and not hasattr(manager, n)]
        assert not missing, (port.__name__, missing)
    gpu_methods = {n for n in dir(GpuPort) if not n.startswith("_")}
    assert {"load", "evict", "run", "device_capacity_bytes", "service_info"} <= gpu_methods


class _Ping:
    """A fake ``actor.ping``: ``remote()`` hands out futures the test resolves."""

    def __init__(self) -> None:
        self.sent: list[concurrent.futures.Future[float]] = []

    def remote(self) -> Any:
        fut: concurrent.futures.Future[float] = concurrent.futures.Future()
        self.sent.append(fut)
        return SimpleNamespace(future=lambda: fut)


class _Controller:
    def __init__(self, known: list[str]) -> None:
        spec = ClusterSpec(cpu_nodes=tuple(CpuNodeSpec(n, (2,), 1 << 30) for n in known))
        self.loop = SimpleNamespace(state=SimpleNamespace(spec=spec))
        self.posted: list[Any] = []

    def post(self, event: Any) -> str:
        self.posted.append(event)
        return ""


def _membership(controller: _Controller) -> tuple[Any, _Ping]:
    pytest.importorskip("ray")
    from arl_tangram.backends.ray import membership as mod
    from arl_tangram.backends.ray.actor import NodeReport
    from arl_tangram.backends.ray.proxies import NodeLink
    from arl_tangram.managers.cpu.config import CpuManagerConfig

    m = mod.RayMembership(
        controller, mod.RaySettings(heartbeat_s=0.5, loss_after_s=3.0), CpuManagerConfig()
    )
    ping = _Ping()
    actor = SimpleNamespace(ping=ping)
    report = NodeReport("ray-a", "host", 1, 1 << 30, (2,), None, None)
    m.links["A"] = NodeLink("ray-a", "A", actor, report)
    m.agents["A"] = NodeAgent("ray-a")
    m.beats["A"] = mod._Beat(last_ok=0.0)
    return m, ping


def test_a_silent_node_is_declared_lost_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from arl_tangram.backends.ray import membership as mod

    killed: list[Any] = []
    monkeypatch.setattr(mod, "_kill", killed.append)
    lost: list[str] = []

    async def scenario() -> None:
        controller = _Controller(["ray-a/cpu"])
        m, ping = _membership(controller)
        m.on_lost.append(lambda agent, _t: lost.append(agent.node_id))
        m.beat(0.5)  # sends the first ping
        assert len(ping.sent) == 1
        ping.sent[0].set_result(1.0)
        await asyncio.sleep(0)  # the wrapped future learns the answer
        await asyncio.sleep(0)
        m.beat(1.0)  # answer read: alive at 1.0, next ping sent
        m.beat(3.9)  # no answer yet, 2.9 s silent: still alive
        assert not controller.posted and not m.links["A"].lost.is_set()
        m.beat(4.1)  # 3.1 s silent: lost
        assert controller.posted == [NodeLost("ray-a/cpu")]  # the GPU id is unknown to the core
        assert m.links["A"].lost.is_set() and "no heartbeat" in m.links["A"].lost_why
        assert not killed and "A" in m.watched  # maybe only paused: watched for a comeback
        m.beat(9.0)
        assert len(controller.posted) == 1 and lost == ["ray-a"] and not killed
        assert m.live_agents == []
        m.beat(4.1 + 300.5)  # silent past rejoin_within_s: given up, its actor killed
        assert len(killed) == 1 and not m.watched and len(controller.posted) == 1

    asyncio.run(scenario())


def test_a_node_lost_for_silence_that_answers_again_comes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from arl_tangram.backends.ray import membership as mod

    killed: list[Any] = []
    monkeypatch.setattr(mod, "_kill", killed.append)

    async def scenario() -> None:
        controller = _Controller(["ray-a/cpu"])
        m, ping = _membership(controller)
        m.beat(0.5)
        assert m.beat(3.6) == [] and "A" in m.watched  # lost; the pending ping stays unanswered
        assert m.beat(3.7) == [] and len(ping.sent) == 2  # watched: pinged afresh
        ping.sent[1].set_result(9.0)  # the pause ends: it answers
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert m.beat(4.0) == ["A"] and not m.watched and not killed
        assert controller.posted == [NodeLost("ray-a/cpu")]

    asyncio.run(scenario())


def test_a_dead_actor_declares_the_node_lost_at_once_a_transient_failure_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from arl_tangram.backends.ray import membership as mod

    monkeypatch.setattr(mod, "_kill", lambda _a: None)
    from ray.exceptions import ActorDiedError

    async def scenario() -> None:
        controller = _Controller(["ray-a/cpu"])
        m, ping = _membership(controller)
        m.beat(0.5)
        ping.sent[0].set_exception(RuntimeError("unreachable for a moment"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        m.beat(1.0)  # a missed beat, a new ping
        assert not controller.posted and len(ping.sent) == 2
        ping.sent[1].set_exception(ActorDiedError())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        m.beat(1.5)
        assert controller.posted == [NodeLost("ray-a/cpu")]
        assert "died" in m.links["A"].lost_why
        assert not m.watched  # a dead actor never comes back: not watched

    asyncio.run(scenario())


def test_calls_on_a_lost_node_fail_fast() -> None:
    pytest.importorskip("ray")
    from arl_tangram.backends.ray.actor import NodeReport
    from arl_tangram.backends.ray.proxies import NodeLink, NodeLostError, RayCpuProxy

    link = NodeLink(
        "ray-a", "A", SimpleNamespace(), NodeReport("ray-a", "h", 1, 1 << 30, (2,), None, None)
    )
    cpu = RayCpuProxy(link)
    assert cpu.numa_cores() == (2,)  # answered from the registration report, no call
    link.declare_lost("node ray-a was lost: test")
    with pytest.raises(NodeLostError, match="node_lost"):
        cpu.destroy_sandbox("env-1")
    assert cpu.list_sandboxes() == []  # its sandboxes went with it
    r = cpu.exec("env-1", "true")  # an action's end is an outcome, as the manager's own failures
    assert (
        r.outcome == "error"
        and r.error is not None
        and r.error.startswith("node_lost: node ray-a was lost")
    )
