"""SWE-ReX details a real ``RemoteRuntime`` tripped over (issue 27, item 7): ``close()`` ends
the env as SWE-ReX's server ends its runtime, and an env that does not exist raises
SWE-ReX's own exception, not aiohttp's."""

from __future__ import annotations

import httpx
import pytest

from arl_tangram.api.server import ServerThread

pytest.importorskip("swerex", reason="the swe-rex package is not installed")
pytestmark = pytest.mark.anyio


async def test_close_releases_the_env_and_an_unknown_env_is_a_swerex_exception(server: ServerThread) -> None:
    from swerex.exceptions import SwerexException
    from swerex.runtime.abstract import Command
    from swerex.runtime.remote import RemoteRuntime

    env_id = httpx.post(f"{server.url}/v1/envs", json={"memory": "128MiB"}, timeout=60).json()["env_id"]
    runtime = RemoteRuntime(host=f"{server.url}/swerex/{env_id}", port=None, auth_token="any")
    assert (await runtime.execute(Command(command="echo hi", shell=True))).stdout == "hi\n"
    await runtime.close()
    assert httpx.get(f"{server.url}/v1/envs/{env_id}").status_code == 404  # released by close()
    gone = RemoteRuntime(host=f"{server.url}/swerex/{env_id}", port=None, auth_token="any")
    with pytest.raises(SwerexException, match="no such environment"):
        await gone.execute(Command(command="true", shell=True))


async def test_whoami_on_the_host_root_is_the_sandbox_user_not_a_host_account(server: ServerThread) -> None:
    from swerex.runtime.abstract import Command
    from swerex.runtime.remote import RemoteRuntime

    env_id = httpx.post(f"{server.url}/v1/envs", json={"memory": "128MiB"}, timeout=60).json()["env_id"]
    runtime = RemoteRuntime(host=f"{server.url}/swerex/{env_id}", port=None, auth_token="any")
    try:
        assert (await runtime.execute(Command(command="whoami", shell=True))).stdout == "sandbox\n"
        passwd = (await runtime.execute(Command(command="cat /etc/passwd", shell=True))).stdout
        assert [line.split(":")[0] for line in passwd.splitlines()] == ["root", "sandbox", "nobody"]
    finally:
        await runtime.close()
