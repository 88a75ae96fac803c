"""mini-swe-agent's stock ``swebench.yaml`` run unchanged on an image env (issue 27, item 9):
its environment block (``cwd: /testbed``, ``interpreter``, ``env``) and the public registry
name its SWE-bench runner gives a task's image, mapped by ``[images] aliases`` to the test's
local SWE-style image (this machine cannot reach docker.io)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from tests.compat.conftest import serve_compat
from tests.images.kit import ImageKit

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed")
pytestmark = pytest.mark.usefixtures("sandbox_host")


def test_the_stock_swebench_config_runs_in_testbed_on_an_aliased_image(image_kit: ImageKit, tmp_path: Path) -> None:
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments import get_environment
    from minisweagent.models.test_models import DeterministicModel, make_output
    from minisweagent.run.benchmarks.swebench import get_swebench_docker_image_name

    stock = yaml.safe_load((builtin_config_dir / "benchmarks/swebench.yaml").read_text())
    public = get_swebench_docker_image_name({"instance_id": "django__django-11099"})  # the runner's own rule
    assert public.startswith("docker.io/swebench/")
    config = image_kit.config(tmp_path / "store", aliases=MappingProxyType({public: image_kit.reference}))
    env_config = {**stock["environment"], "environment_class": "arl_tangram.integrations.minisweagent.TangramEnvironment", "image": public}
    with serve_compat(config) as server:
        env = get_environment({**env_config, "url": server.url, "memory": "256MiB"})
        try:
            assert env.execute({"command": "pwd; echo $TASK"})["output"] == "/testbed\ncalc\n"  # stock cwd, the image's Env
            failing = env.execute({"command": "python3 test_calc.py"})
            assert failing["returncode"] == 1 and "add is wrong" in failing["output"]
            model = DeterministicModel(outputs=[
                make_output("fix", [{"command": "sed -i 's/a - b/a + b/' calc.py && python3 test_calc.py"}]),
                make_output("submit", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat calc.py"}]),
            ])  # fmt: skip
            result = DefaultAgent(model, env, **{**stock["agent"], "step_limit": 5}).run("fix add")
            assert result["exit_status"] == "Submitted" and "a + b" in result["submission"]
        finally:
            env.close()  # type: ignore[attr-defined]
