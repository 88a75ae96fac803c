"""The README's verl YAML exactly as printed (issue 27, items 1 and 3): verl's own tool
registry builds the tool from it and verl's own ``get_custom_reward_fn`` loads the reward
from its ``path`` (a ``pkg://`` module path, right for an editable install); the tool runs
C++, answers a call without code and a call whose env cannot be placed with an error text
the model reads, at once, not after minutes."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat
from tests.integrations.conftest import TOKEN
from tests.integrations.test_verl_adapters import call_tool, live_envs

pytest.importorskip("verl", reason="verl is not installed")
pytestmark = pytest.mark.anyio
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """The module's server keeps warm sandboxes between tests by design (a released env's
    sandbox may go back to its pool): ``serve_compat`` checks the server's whole life."""
    yield


def readme_yaml(url: str) -> str:
    """The YAML block under the README's verl item, with its placeholders filled in."""
    text = README.read_text()
    block = re.search(r"- \*\*verl\*\*.*?```yaml\n(.*?)```", text, re.S)
    assert block is not None, "the README's verl YAML block"
    return block.group(1).replace("http://tangram:8080", url).replace("<token>", TOKEN)


async def test_the_readme_yaml_as_printed(tangram: ServerThread, tmp_path: Path) -> None:
    import yaml
    from omegaconf import OmegaConf
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from arl_tangram.integrations.verl import close_score_clients

    path = tmp_path / "tools.yaml"
    path.write_text(readme_yaml(tangram.url))
    (tool,) = initialize_tools_from_config(str(path))
    reward = yaml.safe_load(path.read_text())["custom_reward_function"]
    assert reward["path"].startswith("pkg://")
    score = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": reward}}))
    assert score is not None
    try:
        cpp = {"language": "cpp", "code": "#include <cstdio>\nint main(){std::printf(\"%d\\n\", 6 * 7);}"}
        assert await call_tool(tool, cpp, "traj-cpp") == "42\n"
        assert (await call_tool(tool, {}, "traj-cpp")).startswith("Error: code:")
        assert "must be one of" in await call_tool(tool, {"code": "x", "language": "cobol"}, "traj-cpp")
        truth = {"inputs": ["2\n"], "outputs": ["4\n"]}
        r: dict[str, Any] = await score("code", "```python\nprint(int(input()) * 2)\n```", truth, {})
        assert r["score"] == 1.0
    finally:
        await tool.aclose()
        await close_score_clients()
    assert live_envs(tangram) == 0


@pytest.fixture
def reserving_tangram() -> Iterator[ServerThread]:
    """Envs hold their limit for their life (``memory_per_action = false``, as pods do), so
    one big env fills the pool (under memory per action an idle env holds its footprint)."""
    from arl_tangram.runtime.config import SchedulerConfig, TangramConfig

    needs_sandbox_host()
    with serve_compat(TangramConfig(scheduler=SchedulerConfig(params={"memory_per_action": False})), tokens={TOKEN: "rl"}) as s:
        yield s


async def test_default_language_cpp_and_a_blocked_call_answers_at_once(reserving_tangram: ServerThread) -> None:
    tangram = reserving_tangram
    import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401 - imported before the clock starts

    from arl_tangram.integrations.verl import TangramCodeTool

    headers = {"Authorization": f"Bearer {TOKEN}"}
    (pool,) = [p for p in httpx.get(f"{tangram.url}/v1/status", headers=headers).json()["pools"] if p["resource"] == "mem_bytes"]
    free_mb = (pool["capacity"] - pool["reserved"]) >> 20
    tool = TangramCodeTool({"sandbox_fusion_url": f"{tangram.url}/t/{TOKEN}/run_code", "default_language": "cpp", "memory_limit_mb": 64})
    hog = httpx.post(f"{tangram.url}/v1/envs", json={"memory": f"{free_mb - 32}MiB"}, headers=headers, timeout=60).json()["env_id"]
    try:
        tool.create_timeout_s = 1.0
        started = time.monotonic()
        text = await call_tool(tool, {"code": "int main(){}"}, "traj-blocked")
        assert text.startswith("Error: the sandbox is unavailable") and "64MiB" in text, text
        assert time.monotonic() - started < 10
    finally:
        httpx.delete(f"{tangram.url}/v1/envs/{hog}", headers=headers)
    try:
        tool.create_timeout_s = 60.0
        assert await call_tool(tool, {"code": "#include <cstdio>\nint main(){std::puts(\"cpp\");}"}, "traj-blocked") == "cpp\n"
    finally:
        await tool.aclose()
    deadline = time.monotonic() + 10  # the abandoned creation's env is released too
    while live_envs(tangram) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_envs(tangram) == 0
