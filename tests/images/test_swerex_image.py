"""The SWE-ReX face on an image env, through SWE-ReX's own unchanged ``RemoteRuntime``: a
SWE-style task (run the failing test in /testbed, upload and apply a patch, run it again:
it passes), reads of any absolute path inside the sandbox (the image's files, never the
host's), while a host-root env keeps its rule (only /workspace and /tmp)."""

from __future__ import annotations

from pathlib import Path

import pytest

import arl_tangram
from tests.compat.conftest import serve_compat
from tests.images.kit import FIXED, ImageKit

pytest.importorskip("aiohttp", reason="SWE-ReX's RemoteRuntime needs aiohttp")
pytest.importorskip("swerex", reason="the swe-rex client package is not installed")
from swerex.runtime.abstract import (  # noqa: E402
    BashAction,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from swerex.runtime.remote import RemoteRuntime  # noqa: E402

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
APPLY = "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text(pathlib.Path(__file__).with_name('calc.py').read_text())\n"


async def test_a_swe_task_on_an_image_through_the_unchanged_remote_runtime(image_kit: ImageKit, tmp_path: Path) -> None:
    (tmp_path / "patch").mkdir()
    (tmp_path / "patch/calc.py").write_text(FIXED)
    (tmp_path / "patch/apply.py").write_text(APPLY)
    with serve_compat(image_kit.config(tmp_path / "store")) as server:
        async with arl_tangram.connect(server.url) as tg:
            env = await tg.create_env(image=image_kit.reference, memory="256MiB")
            rt = RemoteRuntime(host=f"{server.url}/swerex/{env.env_id}", port=None, auth_token="")
            await rt.create_session(CreateBashSessionRequest())
            assert (await rt.run_in_session(BashAction(command="cd /testbed && pwd"))).output == "/testbed\n"
            failing = await rt.run_in_session(BashAction(command="python3 test_calc.py", check="silent"))
            assert failing.exit_code == 1 and "add is wrong" in failing.output
            await rt.upload(UploadRequest(source_path=str(tmp_path / "patch"), target_path="/testbed/.patch"))
            await rt.run_in_session(BashAction(command="python3 .patch/apply.py /testbed/calc.py"))
            passing = await rt.run_in_session(BashAction(command="python3 test_calc.py", check="raise"))
            assert (passing.exit_code, passing.output) == (0, "ok\n")
            await rt.write_file(WriteFileRequest(content="notes\n", path="/testbed/NOTES"))
            assert (await rt.execute(Command(command=["cat", "/testbed/NOTES"]))).stdout == "notes\n"
            passwd = (await rt.read_file(ReadFileRequest(path="/etc/passwd"))).content
            assert passwd.startswith("root:x:0:0:root:/root:/bin/bash\nuser:x:1000")  # the image's, not the host's
            with pytest.raises(FileNotFoundError):
                await rt.read_file(ReadFileRequest(path="/etc/shadow"))  # the host has one; the image has none
            await rt.close()
            host_env = await tg.create_env(memory="128MiB")
            host_rt = RemoteRuntime(host=f"{server.url}/swerex/{host_env.env_id}", port=None, auth_token="")
            with pytest.raises(ValueError):
                await host_rt.read_file(ReadFileRequest(path="/etc/passwd"))  # host root: /workspace and /tmp only
            await host_env.release()
            await env.release()
