"""verl adapters against a real server: the ``BaseTool`` loaded by verl's own tool registry
from a YAML that keeps the old SandboxFusionTool keys and called by verl's own
``ToolAgentLoop._call_tool`` (``create`` -> ``execute(agent_data=...)`` -> ``release`` in a
``finally``, per call) with verl's ``AgentData``; the ``@function_tool``; the async
``compute_score``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.integrations.conftest import TOKEN

pytest.importorskip("verl", reason="verl is not installed")
pytestmark = pytest.mark.anyio


async def call_tool(tool: Any, arguments: dict[str, Any], request_id: str) -> str:
    """One tool call as verl's agent loop makes it: its ``_call_tool`` on a stand-in for the
    loop (only the attributes that method reads) and a real ``AgentData``."""
    pytest.importorskip("cachetools", reason="verl's agent loop needs cachetools")
    from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    loop = SimpleNamespace(tools={tool.name: tool}, max_tool_response_length=10_000, tool_response_truncate_side="middle")
    agent_data = AgentData([], None, None, None, None, {}, request_id, {})  # type: ignore[arg-type]
    call = FunctionCall(name=tool.name, arguments=json.dumps(arguments))
    response, _reward, _metrics = await ToolAgentLoop._call_tool(loop, call, {}, agent_data)  # type: ignore[arg-type]
    return str(response.text)


def live_envs(server: ServerThread) -> int:
    r = httpx.get(f"{server.url}/v1/envs", headers={"Authorization": f"Bearer {TOKEN}"})
    return len(r.json()["envs"])


async def test_the_tool_keeps_an_env_per_trajectory_and_reclaims_it(tangram: ServerThread, tmp_path: Path) -> None:
    from verl.tools.tool_registry import initialize_tools_from_config

    yaml = tmp_path / "tools.yaml"
    yaml.write_text(
        "tools:\n  - class_name: arl_tangram.integrations.verl.TangramCodeTool\n    config:\n      type: native\n"
        f"      sandbox_fusion_url: {tangram.url}/t/{TOKEN}/run_code\n      num_workers: 10\n"
        "      enable_global_rate_limit: true\n      rate_limit: 10\n      default_timeout: 2\n"
        "      default_language: python\n      memory_limit_mb: 256\n"
    )
    (tool,) = initialize_tools_from_config(str(yaml))
    assert tool.name == "code_interpreter"
    try:
        write = {"code": "open('state.txt', 'w').write('kept')\nprint('wrote')"}
        read = {"code": "print(open('state.txt').read())"}
        assert await call_tool(tool, write, "traj-1") == "wrote\n"
        assert await call_tool(tool, read, "traj-1") == "kept\n"  # same trajectory: same env
        assert "FileNotFoundError" in await call_tool(tool, read, "traj-2")  # another trajectory: its own
        assert "timed out" in await call_tool(tool, {"code": "import time; time.sleep(30)"}, "traj-2")
        assert live_envs(tangram) == 2
        tool.env_idle_s = 0.0  # the trajectories above are over: the next call reclaims their envs
        assert await call_tool(tool, {"code": "print(6 * 7)"}, "traj-3") == "42\n"
        assert live_envs(tangram) == 1
    finally:
        await tool.aclose()
    assert live_envs(tangram) == 0


async def test_compute_score_grades_all_cases_in_one_elastic_action(tangram: ServerThread) -> None:
    from arl_tangram.integrations.verl import close_score_clients, compute_score

    cases = json.dumps({"inputs": [f"{i} {i + 1}\n" for i in range(12)], "outputs": [f"{2 * i + 1}\n" for i in range(12)]})
    kwargs: dict[str, Any] = {"sandbox_fusion_url": f"{tangram.url}/t/{TOKEN}/run_code", "timeout": 2}
    try:
        right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
        assert (await compute_score("code", right, cases, **kwargs))["score"] == 1.0
        half = "```python\na, b = map(int, input().split())\nprint(a + b if a % 2 else 0)\n```"
        r = await compute_score("code", half, cases, **kwargs)
        assert r["score"] == 0.5 and not r["acc"] and r["verdicts"][:2] == [False, True]
        slow = "```python\nimport time\na, b = map(int, input().split())\nif a == 3: time.sleep(30)\nprint(a + b)\n```"
        verdicts = (await compute_score("code", slow, cases, **kwargs))["verdicts"]
        assert verdicts[3] == -3 and verdicts.count(True) == 11
        crash = "```python\nraise SystemExit(1)\n```"
        assert set((await compute_score("code", crash, cases, **kwargs))["verdicts"]) == {-2}
        assert (await compute_score("code", "no code here", cases, **kwargs))["score"] == 0.0
        # in the trajectory's own env (named by the tool in extra_fields) its files are there
        import arl_tangram

        async with arl_tangram.connect(tangram.url, token=TOKEN) as tg:
            env = await tg.create_env(memory="256MiB")
            await env.write_file("secret.txt", "kept\n")
            reads = "```python\nprint(open('secret.txt').read().strip())\n```"
            one = json.dumps({"inputs": [""], "outputs": ["kept"]})
            assert (await compute_score("code", reads, one, {"tangram_env_id": env.env_id}, **kwargs))["score"] == 1.0
            assert (await compute_score("code", reads, one, {}, **kwargs))["verdicts"] == [-2]  # a fresh env
            await env.release()
        assert (await compute_score("code", reads, one, {"tangram_env_id": env.env_id}, **kwargs))["verdicts"] == [-2]  # gone: fresh
    finally:
        await close_score_clients()
    assert live_envs(tangram) == 0


async def test_the_function_tool(tangram: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARL_TANGRAM_URL", tangram.url)
    monkeypatch.setenv("ARL_TANGRAM_TOKEN", TOKEN)
    from verl.tools.function_tool import get_function_tool

    import arl_tangram.integrations.verl_function_tool as module

    try:
        tool = get_function_tool("tangram_run_python")
        assert tool.tool_schema.function.parameters.required == ["code"]
        assert await tool.call({"code": "print(input()[::-1])", "stdin": "abc"}) == "cba\n"
    finally:
        await module._client.aclose()
    assert live_envs(tangram) == 0
