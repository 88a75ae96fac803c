"""Memory pressure on a real node (issue 21): a node whose real free memory (a small budget
cgroup around its sandboxes) falls under the reserve stops admitting envs and memory
grants, though its ledger believes it has plenty, and admits again once it recovers.

The ledger is told the node has 1 GiB; the budget cgroup really holds 256 MiB. One env's
tool call allocates ~180 MiB for a few seconds (drives the node to its budget): meanwhile a
new env and a new action wait; when the call ends, both go through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from arl_tangram.bench.memory_budget import Budget
from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.policies.elastic import DEFAULT_MEM_RESERVE_BYTES
from arl_tangram.core.resources import ResourceVector
from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.runtime.actions import ExecPayload, read_result
from arl_tangram.runtime.config import SchedulerConfig, TangramConfig, parse_config
from arl_tangram.runtime.embedded import EmbeddedRuntime

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
MIB = 1 << 20
HOG = "python3 -c \"import time; b = b'x' * (180 << 20); time.sleep(4)\""


async def _until(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _action(action_id: str, env_id: str, command: str, memory_bytes: int) -> tuple[ActionSpec, ExecPayload]:
    spec = ActionSpec(action_id, "tool", Binding("env", env_id), demand_fixed=ResourceVector(cpu_millicores=1000), timeout_s=60.0)
    return replace(spec, memory_bytes=memory_bytes), ExecPayload(command, None, (), None, 60.0)


async def test_under_pressure_envs_and_grants_wait_until_the_node_recovers() -> None:
    budget = Budget(256 * MIB)
    params = {"memory_per_action": True, "mem_reserve_bytes": 128 * MIB}
    config = TangramConfig(scheduler=SchedulerConfig("elastic", params))
    cpu = CpuManagerConfig(default_spec=SandboxSpec(256 * MIB, 128, 4 * MIB, 4 * MIB))
    try:
        with budget.joined():
            rt = await EmbeddedRuntime.start(config, cpu_config=cpu, node_mem_bytes=1024 * MIB)
        try:
            c = rt.controller
            node_id = rt.agent.cpu_node_id
            await c.create_env(EnvSpec("hog", 256 * MIB, workspace_bytes=4 * MIB, tmp_bytes=4 * MIB))
            await c.create_env(EnvSpec("other", 64 * MIB, workspace_bytes=4 * MIB, tmp_bytes=4 * MIB))
            hog = asyncio.ensure_future(read_result(c.submit(*_action("hog-1", "hog", HOG, 200 * MIB))))
            await _until(lambda: c.loop.state.mem_shortfall.get(node_id, 0) > 0, 3.5)
            late_env = asyncio.ensure_future(c.create_env(EnvSpec("late", 64 * MIB, workspace_bytes=4 * MIB, tmp_bytes=4 * MIB)))
            small_task = asyncio.ensure_future(read_result(c.submit(*_action("small-1", "other", "echo fine", 8 * MIB))))
            await asyncio.sleep(1.0)
            assert not hog.done()  # the node is still under pressure
            assert not late_env.done() and not small_task.done(), "admitted while the node was under its reserve"
            assert (await hog).ok
            ok = await asyncio.wait_for(small_task, 10.0)
            assert ok.ok and ok.stdout.strip() == "fine"
            await asyncio.wait_for(late_env, 10.0)
            assert "late" in rt.agent.cpu.list_sandboxes()  # type: ignore[union-attr]
        finally:
            await rt.aclose()
    finally:
        budget.remove()



async def test_scheduler_params_memory_pause_and_reserve_reach_the_runtime() -> None:
    config = parse_config("[scheduler]\npolicy = 'elastic'\n[scheduler.params]\nmemory_pause = false\n")
    policy = config.scheduler.make_policy()
    assert policy.memory_pause is False and policy.mem_reserve_bytes == DEFAULT_MEM_RESERVE_BYTES  # type: ignore[attr-defined]
    rt = await EmbeddedRuntime.start(config, cpu_config=CpuManagerConfig(default_spec=SandboxSpec(64 * MIB, 64, 4 * MIB, 4 * MIB)))
    try:
        assert rt.controller.executor is not None and rt.controller.executor.memory_pause is False
    finally:
        await rt.aclose()
    with pytest.raises(SpecError, match="mem_reserve_bytes"):
        parse_config("[scheduler.params]\nmem_reserve_bytes = -1\n")
    with pytest.raises(SpecError, match="memory_pause"):
        parse_config("[scheduler.params]\nmemory_pause = 'yes'\n")
