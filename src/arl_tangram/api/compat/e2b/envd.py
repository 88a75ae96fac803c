"""Shell: which sandbox an envd call is for, and the call shapes envd's services share.

With ``E2B_SANDBOX_URL`` set (to ``<server><prefix>``) the SDK names the sandbox in the
``E2b-Sandbox-Id`` header (``E2b-Sandbox-Port`` must be envd's 49983); without it, in the
host (``49983-<id>.<domain>``) as E2B's edge routes. ``X-Access-Token`` must be the
``envdAccessToken`` the sandbox was created with (the sandbox id alone proves nothing),
else ``unauthenticated``; an unknown or ended sandbox is ``not_found`` with why, a paused
one ``unavailable``. Runtime errors map to Connect codes: ``SpecError`` ->
``invalid_argument``, ``Overloaded`` -> ``unavailable``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from arl_tangram.api.compat.e2b import connect
from arl_tangram.api.compat.e2b.connect import ConnectError
from arl_tangram.api.compat.e2b.sandboxes import E2bSandbox, E2bState, e2b_state
from arl_tangram.api.state import Overloaded
from arl_tangram.core.errors import SpecError

ENVD_PORT = 49983

Work = Callable[[E2bState, E2bSandbox, Any], Awaitable[Any]]


def sandbox_id_of(request: Request) -> str:
    given = request.headers.get("e2b-sandbox-id")
    if given:
        port = request.headers.get("e2b-sandbox-port", str(ENVD_PORT))
        if port != str(ENVD_PORT):
            raise ConnectError("unavailable", f"port {port} of sandbox {given} is not open: only envd ({ENVD_PORT}) is served")
        return given
    host = request.headers.get("host", "").split(":", 1)[0]
    label = host.split(".", 1)[0]
    if label.startswith(f"{ENVD_PORT}-"):
        return label[len(f"{ENVD_PORT}-") :]
    raise ConnectError("not_found", "no sandbox named: send E2b-Sandbox-Id (E2B_SANDBOX_URL) or use the 49983-<id>.<domain> host")


def envd_sandbox(request: Request) -> tuple[E2bState, E2bSandbox]:
    """The sandbox the call names, its access token checked. ``ConnectError`` otherwise."""
    e2b = e2b_state(request)
    sandbox_id = sandbox_id_of(request)
    sb = e2b.sandboxes.get(sandbox_id)
    if sb is None:
        raise ConnectError("not_found", f"sandbox {sandbox_id!r} not found: it {e2b.why_gone(sandbox_id)}")
    if not sb.token_ok(request.headers.get("x-access-token")):
        raise ConnectError("unauthenticated", "X-Access-Token: must be the sandbox's envdAccessToken")
    if sb.paused:
        raise ConnectError("unavailable", f"sandbox {sandbox_id!r} is paused: resume or connect to it first")
    if sb.internal in e2b.api.controller.env_specs:
        e2b.api.controller.renew_env(sb.internal)
    return e2b, sb


def as_connect(exc: Exception) -> ConnectError:
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, Overloaded):
        return ConnectError("unavailable", exc.rule)
    if isinstance(exc, SpecError | ValueError):
        return ConnectError("invalid_argument", str(exc))
    if isinstance(exc, FileNotFoundError):
        return ConnectError("not_found", str(exc))
    return ConnectError("internal", f"{type(exc).__name__}: {exc}")


async def unary(request: Request, request_cls: type, work: Work) -> Response:
    """A unary call: decode, ``work(e2b, sandbox, message)`` -> the reply message."""
    try:
        codec = connect.codec_of(request, stream=False)
        e2b, sb = envd_sandbox(request)
        message: Any = connect.decode(await request.body(), request_cls, codec)
        return connect.unary_reply(await work(e2b, sb, message), codec)
    except Exception as exc:  # noqa: BLE001 - every failure goes back as a Connect error
        return connect.unary_error(as_connect(exc))


Stream = Callable[[E2bState, E2bSandbox, Any, str], Awaitable[AsyncIterator[Any]]]


async def server_stream(request: Request, request_cls: type, opener: Stream) -> Response:
    """A server stream: ``opener(e2b, sandbox, message, codec)`` checks the call and
    returns the reply messages' iterator; an error before or during it ends the stream in
    the end-stream envelope (HTTP 200, as Connect streams do)."""
    codec = "json"
    try:
        codec = connect.codec_of(request, stream=True)
        e2b, sb = envd_sandbox(request)
        message: Any = connect.decode(await connect.first_envelope(request), request_cls, codec)
        messages = await opener(e2b, sb, message, codec)
    except Exception as exc:  # noqa: BLE001
        failed = connect.end_stream(as_connect(exc))
        return Response(failed, 200, media_type=connect.stream_media_type(codec))

    async def body() -> AsyncIterator[bytes]:
        error = None
        try:
            async for reply in messages:
                yield connect.envelope(connect.encode(reply, codec))
        except Exception as exc:  # noqa: BLE001
            error = as_connect(exc)
        yield connect.end_stream(error)

    return StreamingResponse(body(), media_type=connect.stream_media_type(codec))
