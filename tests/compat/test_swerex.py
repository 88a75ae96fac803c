"""The SWE-ReX face, checked with SWE-ReX's own ``RemoteRuntime`` on a per-environment base
URL: every method, bash state across commands, the exceptions it re-raises, interrupts,
uploads of a file and a directory, and the ``X-API-Key`` check."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import arl_tangram
from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat

pytest.importorskip("aiohttp", reason="SWE-ReX's RemoteRuntime needs aiohttp")
pytest.importorskip("swerex", reason="the swe-rex client package is not installed")
from swerex.exceptions import (  # noqa: E402
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
    SwerexException,
)
from swerex.runtime.abstract import (  # noqa: E402
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from swerex.runtime.remote import RemoteRuntime  # noqa: E402

pytestmark = pytest.mark.anyio
TOKEN = "tok-swerex"


@pytest.fixture(scope="module")
def swerex_server() -> Iterator[ServerThread]:
    needs_sandbox_host()
    with serve_compat(tokens={TOKEN: "bob"}) as s:
        yield s


@pytest.fixture
async def runtime(swerex_server: ServerThread) -> AsyncIterator[RemoteRuntime]:
    async with arl_tangram.connect(swerex_server.url, token=TOKEN) as tg:
        env = await tg.create_env(memory="256MiB")
        yield RemoteRuntime(host=f"{swerex_server.url}/swerex/{env.env_id}", port=None, auth_token=TOKEN)
        await env.release()


async def test_sessions_keep_state_and_raise_swerex_exceptions(runtime: RemoteRuntime) -> None:
    assert (await runtime.is_alive()).is_alive
    await runtime.create_session(CreateBashSessionRequest())
    with pytest.raises(SessionExistsError):
        await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(BashAction(command="export X=5; cd /tmp; f() { echo f$1; }"))
    r = await runtime.run_in_session(BashAction(command="echo $X; pwd; f 1; echo to-err >&2"))
    assert (r.output, r.exit_code) == ("5\n/tmp\nf1\nto-err\n", 0)
    with pytest.raises(NonZeroExitCodeError):
        await runtime.run_in_session(BashAction(command="false", check="raise"))
    silent = await runtime.run_in_session(BashAction(command="exit_code() { return 3; }; exit_code", check="silent"))
    assert silent.exit_code == 3
    with pytest.raises(CommandTimeoutError):
        await runtime.run_in_session(BashAction(command="sleep 30", timeout=0.5))
    with pytest.raises(BashIncorrectSyntaxError):
        await runtime.run_in_session(BashAction(command="if then fi ("))
    assert (await runtime.run_in_session(BashAction(command="echo $X"))).output == "5\n"  # the shell survived
    with pytest.raises(SessionDoesNotExistError):
        await runtime.run_in_session(BashAction(command="true", session="other"))
    await runtime.close_session(CloseBashSessionRequest())
    with pytest.raises(SessionDoesNotExistError):
        await runtime.close_session(CloseBashSessionRequest())
    await runtime.close()


async def test_an_interrupt_stops_the_running_command(runtime: RemoteRuntime) -> None:
    await runtime.create_session(CreateBashSessionRequest(session="s"))
    running = asyncio.ensure_future(runtime.run_in_session(BashAction(command="sleep 30", session="s", timeout=60)))
    await asyncio.sleep(0.5)
    await runtime.run_in_session(BashInterruptAction(session="s"))
    with pytest.raises(SwerexException):
        await asyncio.wait_for(running, 10)
    assert (await runtime.run_in_session(BashAction(command="echo alive", session="s"))).output == "alive\n"
    await runtime.close()


async def test_execute_files_and_uploads(runtime: RemoteRuntime, tmp_path: Path) -> None:
    r = await runtime.execute(Command(command=["python3", "-c", "import sys; print(1); print(2, file=sys.stderr)"]))
    assert (r.stdout, r.stderr, r.exit_code) == ("1\n", "2\n", 0)
    shell = await runtime.execute(Command(command="echo $GREETING from $(pwd)", shell=True, env={"GREETING": "hi"}, cwd="/tmp"))
    assert shell.stdout == "hi from /tmp\n"
    with pytest.raises(NonZeroExitCodeError):
        await runtime.execute(Command(command="exit 4", shell=True, check=True))
    with pytest.raises(CommandTimeoutError):
        await runtime.execute(Command(command=["sleep", "30"], timeout=0.5))
    await runtime.write_file(WriteFileRequest(content="héllo\n", path="dir/a.txt"))
    assert (await runtime.read_file(ReadFileRequest(path="/workspace/dir/a.txt"))).content == "héllo\n"
    with pytest.raises(FileNotFoundError):
        await runtime.read_file(ReadFileRequest(path="missing.txt"))
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "top.py").write_text("print('top')\n")
    (tmp_path / "tree" / "sub" / "deep.txt").write_text("deep\n")
    await runtime.upload(UploadRequest(source_path=str(tmp_path / "tree"), target_path="/workspace/repo"))
    await runtime.upload(UploadRequest(source_path=str(tmp_path / "tree" / "top.py"), target_path="/tmp/one.py"))
    listed = await runtime.execute(Command(command="cat repo/sub/deep.txt && python3 repo/top.py && python3 /tmp/one.py", shell=True))
    assert listed.stdout == "deep\ntop\ntop\n"


async def test_a_wrong_key_is_401_and_an_unknown_env_a_swerex_exception(swerex_server: ServerThread, runtime: RemoteRuntime) -> None:
    import aiohttp

    host = runtime._config.host
    with pytest.raises(aiohttp.ClientResponseError) as wrong:
        await RemoteRuntime(host=host, port=None, auth_token="nope").execute(Command(command=["true"]))
    assert wrong.value.status == 401
    with pytest.raises(SwerexException, match="no such environment 'env-nope'"):  # SWE-ReX's own (issue 27)
        await RemoteRuntime(host=f"{swerex_server.url}/swerex/env-nope", port=None, auth_token=TOKEN).execute(Command(command=["true"]))


async def test_a_repeated_request_id_gets_the_first_answer(runtime: RemoteRuntime) -> None:
    import httpx

    headers = {"X-API-Key": TOKEN, "X-Request-ID": "same-id"}
    body = {"command": "echo x >> log.txt; wc -l < log.txt", "shell": True}
    async with httpx.AsyncClient(base_url=runtime._config.host) as client:
        first = await client.post("/execute", json=body, headers=headers)
        again = await client.post("/execute", json=body, headers=headers)
    assert first.json() == again.json() == {"stdout": "1\n", "stderr": "", "exit_code": 0}
