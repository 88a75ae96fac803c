"""SWE-ReX uploads are streamed into the env's own /tmp (api/compat/upload_stream.py and
managers/cpu/spool.py), checked with SWE-ReX's own ``RemoteRuntime``: an upload counts
against that sandbox's /tmp quota (too big for it: refused, nothing left behind), a large
one arrives intact, and a broken archive is the caller's ``ValueError``."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import arl_tangram
from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat

pytest.importorskip("aiohttp", reason="SWE-ReX's RemoteRuntime needs aiohttp")
pytest.importorskip("swerex", reason="the swe-rex client package is not installed")
from swerex.runtime.abstract import Command, UploadRequest  # noqa: E402
from swerex.runtime.remote import RemoteRuntime  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    needs_sandbox_host()
    with serve_compat() as s:
        yield s


@pytest.fixture
async def runtime(server: ServerThread) -> AsyncIterator[RemoteRuntime]:
    async with arl_tangram.connect(server.url) as tg:
        env = await tg.create_env(memory="256MiB", tmp="8MiB", workspace="64MiB")
        yield RemoteRuntime(host=f"{server.url}/swerex/{env.env_id}", port=None, auth_token="")
        await env.release()


async def test_an_upload_is_spooled_in_the_sandboxes_own_tmp(runtime: RemoteRuntime, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"z" * (48 << 20))  # fits the workspace (64 MiB), not the 8 MiB /tmp; most of it
    # is still unsent when /tmp fills: the refusal must wait for the body, not reset it
    with pytest.raises(ValueError, match="free space in /tmp"):
        await runtime.upload(UploadRequest(source_path=str(big), target_path="/workspace/big.bin"))
    left = await runtime.execute(Command(command="ls -A /tmp /workspace", shell=True))
    assert "tangram" not in left.stdout and "big.bin" not in left.stdout, left.stdout
    data = bytes(range(256)) * (24 << 10)  # 6 MiB: fits
    ok = tmp_path / "ok.bin"
    ok.write_bytes(data)
    await runtime.upload(UploadRequest(source_path=str(ok), target_path="/workspace/ok.bin"))
    digest = await runtime.execute(Command(command=["sha256sum", "/workspace/ok.bin"]))
    assert digest.stdout.split()[0] == hashlib.sha256(data).hexdigest()


async def test_a_broken_archive_is_the_callers_error(runtime: RemoteRuntime, tmp_path: Path) -> None:
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("file", b"PK\x03\x04 not really a zip", filename="x.zip", content_type="application/zip")
    form.add_field("target_path", "/workspace/unzipped")
    form.add_field("unzip", "true")
    async with aiohttp.ClientSession() as session, session.post(f"{runtime._api_url}/upload", data=form) as response:
        body = await response.json()
    assert response.status == 511 and body["swerexception"]["class_path"] == "builtins.ValueError", body
    assert "zip archive" in body["swerexception"]["message"]


async def test_a_refusal_mid_body_waits_for_the_rest_of_the_body() -> None:
    """Answering while the client still sends resets the connection (the client then sees
    a reset, not the refusal): ``receive_upload`` reads the whole body before it raises."""
    from starlette.requests import Request

    from arl_tangram.api.compat.upload_stream import BATCH_BYTES, receive_upload
    from arl_tangram.managers.cpu.errors import ConflictError

    head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
    chunks = [head] + [b"z" * BATCH_BYTES] * 6 + [b"\r\n--b--\r\n"]
    sent = 0

    async def receive() -> dict[str, object]:
        nonlocal sent
        sent += 1
        return {"type": "http.request", "body": chunks[sent - 1], "more_body": sent < len(chunks)}

    class FullSpool:
        def write(self, data: bytes) -> None:
            raise ConflictError("file", "must fit the sandbox's free space in /tmp (the upload is spooled there)", len(data))

    scope = {"type": "http", "method": "POST", "path": "/upload", "headers": [(b"content-type", b"multipart/form-data; boundary=b")]}
    with pytest.raises(ConflictError, match="free space in /tmp"):
        await receive_upload(Request(scope, receive), FullSpool())
    assert sent == len(chunks), f"refused after {sent} of {len(chunks)} body messages"
