"""The mini-swe-agent / SkyRL environment class and the SWE-ReX deployment, against a real
server: each selected by its dotted path, as the frameworks' configs do."""

from __future__ import annotations

import importlib
import platform
from typing import Any

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.integrations.conftest import TOKEN


def by_dotted_path(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def live_envs(server: ServerThread) -> int:
    return len(httpx.get(f"{server.url}/v1/envs", headers={"Authorization": f"Bearer {TOKEN}"}).json()["envs"])


def test_the_minisweagent_environment(tangram: ServerThread) -> None:
    cls = by_dotted_path("arl_tangram.integrations.minisweagent.TangramEnvironment")
    with cls(url=tangram.url, token=TOKEN, memory="256MiB", timeout=5, env={"PAGER": "cat"}) as env:
        r = env.execute({"command": "echo out; echo err >&2; echo $PAGER; exit 3"})
        assert r == {"output": "out\nerr\ncat\n", "returncode": 3, "exception_info": ""}
        env.execute("mkdir -p repo && echo 'print(1)' > repo/a.py")  # the v1 form: a plain string
        assert env.execute({"command": "python3 a.py"}, cwd="/workspace/repo")["output"] == "1\n"
        slow = env.execute({"command": "echo started; sleep 30"}, timeout=0.5)
        assert slow["returncode"] == -1 and "timed out" in slow["exception_info"]
        assert env.get_template_vars()["env_id"] and env.serialize()["info"]["config"]["environment"]["token"] is None
        assert live_envs(tangram) == 1
    assert live_envs(tangram) == 0


def test_a_real_minisweagent_run_submits_from_the_sandbox(tangram: ServerThread) -> None:
    pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments import get_environment
    from minisweagent.models.test_models import DeterministicModel, make_output

    config = {"environment_class": "arl_tangram.integrations.minisweagent.TangramEnvironment", "url": tangram.url, "token": TOKEN, "memory": "256MiB"}
    env = get_environment(config)
    try:
        model = DeterministicModel(outputs=[
            make_output("write it", [{"command": "echo patched > fix.txt"}]),
            make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat fix.txt"}]),
        ])  # fmt: skip
        agent = DefaultAgent(model, env, system_template="You fix bugs.", instance_template="{{task}}", step_limit=5)
        result = agent.run("fix it")
        assert result["exit_status"] == "Submitted" and result["submission"] == "patched\n"
    finally:
        env.close()  # type: ignore[attr-defined]
    assert live_envs(tangram) == 0


@pytest.mark.anyio
async def test_the_swerex_deployment_hands_back_a_remote_runtime(tangram: ServerThread) -> None:
    pytest.importorskip("swerex", reason="the swe-rex package is not installed")
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

    config_cls = by_dotted_path("arl_tangram.integrations.swerex.TangramDeploymentConfig")
    deployment = config_cls(url=tangram.url, token=TOKEN, memory="256MiB").get_deployment()
    await deployment.start()
    try:
        assert (await deployment.is_alive()).is_alive
        await deployment.runtime.create_session(CreateBashSessionRequest())
        await deployment.runtime.run_in_session(BashAction(command="cd /tmp && X=7"))
        assert (await deployment.runtime.run_in_session(BashAction(command="echo $X $(pwd)"))).output == "7 /tmp\n"
        assert live_envs(tangram) == 1
    finally:
        await deployment.stop()
    assert live_envs(tangram) == 0


@pytest.mark.parametrize("config_name", ["default.yaml", "mini.yaml", "benchmarks/swebench.yaml"])
def test_the_stock_minisweagent_configs_run(tangram: ServerThread, config_name: str) -> None:
    """Issue 27, item 9: the stock configs' templates render (the template variables the
    Local and Docker environments give) and swebench.yaml's environment block loads
    (``interpreter``; its ``cwd: /testbed`` needs an image env: replaced by a host path here);
    ``execute`` after ``close`` says so."""
    pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed")
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments import get_environment
    from minisweagent.models.test_models import DeterministicModel, make_output

    stock = yaml.safe_load((builtin_config_dir / config_name).read_text())
    env_config = {**stock.get("environment", {}), "environment_class": "arl_tangram.integrations.minisweagent.TangramEnvironment"}
    if env_config.get("cwd") == "/testbed":
        env_config["cwd"] = "/workspace"
    env = get_environment({**env_config, "url": tangram.url, "token": TOKEN, "memory": "256MiB"})
    try:
        model = DeterministicModel(outputs=[
            make_output("look", [{"command": "uname -s; echo $PAGER"}]),
            make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done"}]),
        ])  # fmt: skip
        agent = DefaultAgent(model, env, **{**stock["agent"], "step_limit": 5})
        result = agent.run("say done")
        assert result["exit_status"] == "Submitted" and result["submission"] == "done\n"
        if "{{system}}" in stock["agent"]["instance_template"]:  # rendered from get_template_vars
            assert platform.uname().system in str(agent.messages[:2])
    finally:
        env.close()  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="after close"):
        env.execute({"command": "true"})
    assert live_envs(tangram) == 0
