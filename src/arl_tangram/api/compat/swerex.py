"""Shell: the SWE-ReX face: a ``RemoteRuntime`` per environment at ``/swerex/<env_id>``.

``RemoteRuntime(host=f"{url}/swerex/{env_id}", port=None, auth_token=token)`` works
unmodified: its calls (``is_alive``, ``create_session``, ``run_in_session``,
``close_session``, ``execute``, ``read_file``, ``write_file``, ``upload``, ``close``) land
on the tenant's env (created beforehand through the native API or the SDK; ``X-API-Key``
is the tenant's token, any key when no tokens are set). Every command is one scheduled
action: a session command runs in the env's persistent bash (cwd, variables, functions
kept), with stderr merged into the output as a terminal shows it; there is no fixed wait
per command. Runtime failures travel as HTTP 511 ``{"swerexception": {message, class_path,
traceback, extra_info}}`` so the client re-raises them: ``CommandTimeoutError``,
``NonZeroExitCodeError`` (``check="raise"``), ``BashIncorrectSyntaxError`` (checked with
``bash -n`` on the host before anything runs), ``SessionExistsError``,
``SessionDoesNotExistError``; file errors as the builtins (``FileNotFoundError``,
``ValueError`` for a path outside /workspace and /tmp on a host-root env). On an image env
(a SWE task's repo at ``/testbed``) reads, writes and uploads may name any absolute path
inside the sandbox: the CPU manager resolves them inside the sandbox's own root, so a
symlink in the image never reaches a host file. A repeated ``X-Request-ID`` gets the
first answer again. ``close`` ends the runtime as SWE-ReX's server does: its sessions
close and the env is released (a deployment's later release is a no-op). An env that does
not exist (never made, released, expired) is SWE-ReX's ``SwerexException`` (511), which the
client re-raises, not a bare 404. Interactive commands (``expect``) are not supported (a clear error).
On a host-root env ``whoami`` is ``sandbox`` (the CPU manager binds a generated passwd/group
pair over the host's); ``pip install`` there meets the host's externally-managed Python on a
read-only root, by design: an agent that installs packages needs an image env.
"""

from __future__ import annotations

import asyncio
import collections
import shlex
import subprocess
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from arl_tangram.api.compat.pool import env_cpu, run_env_action
from arl_tangram.api.compat.tenancy import CompatState, Unauthorized, compat_state, tenant_for
from arl_tangram.api.compat.upload_stream import receive_upload
from arl_tangram.api.edge import BodyTooLarge
from arl_tangram.api.json_body import JsonBodyRoute, read_json
from arl_tangram.api.state import DEFAULT_TENANT, NotFound
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import ActionResult, ExecPayload

router = APIRouter(prefix="/swerex/{env_id}", tags=["swerex"], route_class=JsonBodyRoute)  # SWE-ReX's contract; in /openapi.json under its tag
DEFAULT_TIMEOUT_S = 3600.0  # SWE-ReX's ``timeout: None``: no limit of its own; ours is an hour
MAX_UNZIPPED_BYTES = 1 << 30  # an archive's members together, unpacked
MAX_REPLIES = 64
EXC = "swerex.exceptions."


class SwerexError(Exception):
    """A runtime failure the client re-raises as ``class_path``."""

    def __init__(self, class_path: str, message: str, extra_info: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.class_path, self.message, self.extra_info = class_path, message, extra_info or {}

    def response(self) -> JSONResponse:
        body = {"message": self.message, "class_path": self.class_path, "traceback": "", "extra_info": self.extra_info}
        return JSONResponse({"swerexception": body}, status_code=511)


@dataclass
class SwerexEnv:
    """One env's SWE-ReX state: its sessions (name -> CPU manager session id) and recent
    answers by request id."""

    sessions: dict[str, str] = field(default_factory=dict)
    replies: collections.OrderedDict[str, tuple[int, bytes]] = field(default_factory=collections.OrderedDict)


def _as_swerex(exc: Exception) -> SwerexError:
    if isinstance(exc, SwerexError):
        return exc
    for builtin in (FileNotFoundError, IsADirectoryError, PermissionError, ValueError):
        if isinstance(exc, builtin):
            return SwerexError(f"builtins.{builtin.__name__}", str(exc))
    return SwerexError(f"{EXC}SwerexException", f"{type(exc).__name__}: {exc}")


async def _face(request: Request, env_id: str, work: Any) -> Response:
    """Auth (401), env lookup (404), replay by ``X-Request-ID``, then ``work(compat,
    tenant, internal_env_id, swerex_env)``; failures as 511."""
    compat = compat_state(request)
    state = compat.api
    try:
        tenant = tenant_for(state, request.headers.get("x-api-key") or None) if state.tokens else DEFAULT_TENANT
        internal = state.env_internal(tenant, env_id)
    except Unauthorized:
        return JSONResponse({"detail": "Invalid API Key"}, status_code=401)
    except NotFound as exc:  # the client re-raises a 511 as SWE-ReX's own exception
        return SwerexError(f"{EXC}SwerexException", f"no such environment {env_id!r} (never created, released or expired): {exc}").response()
    env = compat.swerex_envs.setdefault(internal, SwerexEnv())
    request_id = request.headers.get("x-request-id")
    if request_id is not None and request_id in env.replies:
        status, content = env.replies[request_id]
        return Response(content, status, media_type="application/json")
    try:
        response: Response = JSONResponse(await asyncio.shield(state.spawn(work(compat, tenant, internal, env))))
    except BodyTooLarge:
        raise  # the edge's 413, not a runtime failure
    except Exception as exc:  # noqa: BLE001 - every runtime failure goes to the client as SWE-ReX does
        response = _as_swerex(exc).response()
    if request_id is not None:
        env.replies[request_id] = (response.status_code, bytes(response.body))
        while len(env.replies) > MAX_REPLIES:
            env.replies.popitem(last=False)
    return response


async def _json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object (422 naming the rule otherwise; parsed off the loop when large)."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise SpecError("body", "must be a JSON object", type(body).__name__)
    return body


@router.get("/is_alive")
async def is_alive(request: Request, env_id: str) -> Response:
    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        return {"is_alive": True, "message": ""}

    return await _face(request, env_id, work)


def _check_syntax(command: str) -> None:
    """``bash -n`` on the host: parses, never runs. ``BashIncorrectSyntaxError`` if it fails."""
    r = subprocess.run(["bash", "-n"], input=command.encode(), capture_output=True, timeout=10, check=False)
    if r.returncode != 0:
        stderr = r.stderr.decode(errors="backslashreplace")
        message = f"Error (exit code {r.returncode}) while checking bash command \n{command!r}\n---- Stderr ----\n{stderr}"
        raise SwerexError(f"{EXC}BashIncorrectSyntaxError", message, {"bash_stdout": "", "bash_stderr": stderr})


def _session(env: SwerexEnv, name: str) -> str:
    if name not in env.sessions:
        raise SwerexError(f"{EXC}SessionDoesNotExistError", f"session does not exist: {name!r}")
    return env.sessions[name]


@router.post("/create_session")
async def create_session(request: Request, env_id: str) -> Response:
    body = await _json_object(request)

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        name = str(body.get("session", "default"))
        if name in env.sessions:
            raise SwerexError(f"{EXC}SessionExistsError", f"session already exists: {name!r}")
        env.sessions[name] = await asyncio.to_thread(env_cpu(compat.api, internal).open_session, internal)
        output = ""
        for path in body.get("startup_source") or []:
            r = await _in_session(compat, tenant, internal, env, name, f"source {shlex.quote(str(path))}", float(body.get("startup_timeout") or 1.0) + 10)
            output += r.stdout
        return {"output": output, "session_type": "bash"}

    return await _face(request, env_id, work)


async def _in_session(compat: CompatState, tenant: str, internal: str, env: SwerexEnv, name: str, command: str, timeout_s: float) -> ActionResult:
    """One command in the named session as an action; stderr merged in order (the braces
    run it in the session's own shell, so its state changes persist)."""
    payload = ExecPayload("{ " + command + "\n} 2>&1", None, (), None, timeout_s, session_id=_session(env, name))
    return await run_env_action(compat.api, tenant, internal, "swerex:session", payload)


@router.post("/run_in_session")
async def run_in_session(request: Request, env_id: str) -> Response:
    body = await _json_object(request)

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        name = str(body.get("session", "default"))
        if body.get("action_type") == "bash_interrupt":
            return await _interrupt(compat, env, name)
        if body.get("is_interactive_command") or body.get("is_interactive_quit") or body.get("expect"):
            raise SwerexError("builtins.NotImplementedError", "interactive commands (expect) are not supported by ARL-Tangram sessions")
        command = str(body["command"])
        _session(env, name)
        await asyncio.to_thread(_check_syntax, command)
        timeout_s = float(body.get("timeout") or DEFAULT_TIMEOUT_S)
        r = await _in_session(compat, tenant, internal, env, name, command, timeout_s)
        if r.outcome == "timed_out":
            raise SwerexError(f"{EXC}CommandTimeoutError", f"timeout after {timeout_s} seconds while running command {command!r}")
        if r.outcome not in ("succeeded", "failed"):
            raise SwerexError(f"{EXC}SwerexException", f"the command ended {r.outcome}: {r.cause or ''}")
        check = body.get("check", "raise")
        if check == "raise" and r.exit_code != 0:
            message = f"Command {command!r} failed with exit code {r.exit_code}. Here is the output:\n{r.stdout!r}"
            raise SwerexError(f"{EXC}NonZeroExitCodeError", f"{body['error_msg']}: {message}" if body.get("error_msg") else message)
        exit_code = None if check == "ignore" else r.exit_code
        return {"output": r.stdout, "exit_code": exit_code, "failure_reason": "", "expect_string": "", "session_type": "bash"}

    return await _face(request, env_id, work)


async def _interrupt(compat: CompatState, env: SwerexEnv, name: str) -> dict[str, Any]:
    """Stop the session's running command (its action is cancelled; the shell stays)."""
    _session(env, name)
    store = compat.api.controller.store
    for action_id in store.unfinished():
        record = store.get(action_id)
        payload = getattr(record, "payload", None)
        if payload is not None and getattr(payload, "session_id", None) == env.sessions[name]:
            compat.api.controller.cancel(action_id)
    return {"output": "", "exit_code": None, "failure_reason": "", "expect_string": "", "session_type": "bash"}


@router.post("/close_session")
async def close_session(request: Request, env_id: str) -> Response:
    body = await _json_object(request)

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        session_id = _session(env, str(body.get("session", "default")))
        env.sessions.pop(str(body.get("session", "default")))
        await asyncio.to_thread(env_cpu(compat.api, internal).close_session, session_id)
        return {"session_type": "bash"}

    return await _face(request, env_id, work)


def _argv(body: dict[str, Any]) -> tuple[str, ...]:
    command = body["command"]
    if body.get("shell"):
        line = command if isinstance(command, str) else shlex.join(command)
        argv: tuple[str, ...] = ("bash", "-c", line)
    else:
        argv = tuple(shlex.split(command)) if isinstance(command, str) else tuple(str(c) for c in command)
    if body.get("merge_output_streams"):
        argv = ("bash", "-c", 'exec "$@" 2>&1', "merge", *argv)
    return argv


@router.post("/execute")
async def execute(request: Request, env_id: str) -> Response:
    body = await _json_object(request)

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        timeout_s = float(body.get("timeout") or DEFAULT_TIMEOUT_S)
        env_vars = tuple(sorted((body.get("env") or {}).items()))
        payload = ExecPayload(_argv(body), None, env_vars, body.get("cwd"), timeout_s)
        r = await run_env_action(compat.api, tenant, internal, "swerex:execute", payload)
        if r.outcome == "timed_out":
            raise SwerexError(f"{EXC}CommandTimeoutError", f"Timeout ({timeout_s}s) exceeded while running command")
        if r.outcome not in ("succeeded", "failed"):
            raise SwerexError(f"{EXC}SwerexException", f"the command ended {r.outcome}: {r.cause or ''}")
        if body.get("check") and r.exit_code != 0:
            message = f"Command {body['command']!r} failed with exit code {r.exit_code}. Stdout:\n{r.stdout!r}\nStderr:\n{r.stderr!r}"
            raise SwerexError(f"{EXC}NonZeroExitCodeError", f"{body['error_msg']}: {message}" if body.get("error_msg") else message)
        return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}

    return await _face(request, env_id, work)


@router.post("/read_file")
async def read_file(request: Request, env_id: str) -> Response:
    body = await _json_object(request)

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        data: bytes = await asyncio.to_thread(env_cpu(compat.api, internal).read_file, internal, str(body["path"]))
        return {"content": data.decode(body.get("encoding") or "utf-8", body.get("errors") or "strict")}

    return await _face(request, env_id, work)


@router.post("/write_file")
async def write_file(request: Request, env_id: str) -> Response:
    body = await _json_object(request)

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        await asyncio.to_thread(env_cpu(compat.api, internal).write_file, internal, str(body["path"]), str(body["content"]))
        return {}

    return await _face(request, env_id, work)


@router.post("/upload")
async def upload(request: Request, env_id: str) -> Response:
    """A file (``unzip`` false) or a zipped directory (``unzip`` true) to ``target_path``,
    streamed into the env's sandbox as it arrives (``upload_stream``), never spooled on the
    host; the body is capped by ``[service] max_upload_bytes`` (413)."""

    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        spool = await asyncio.to_thread(env_cpu(compat.api, internal).open_spool, internal)
        try:
            fields = await receive_upload(request, spool)
            target = fields.get("target_path", "")
            if not target:
                raise SwerexError("builtins.ValueError", "target_path: is required")
            unzip = fields.get("unzip", "false").lower() == "true"
            await asyncio.to_thread(spool.place, target, unzip, MAX_UNZIPPED_BYTES)
        finally:
            await asyncio.to_thread(spool.close)
        return {}

    return await _face(request, env_id, work)


@router.post("/close")
async def close(request: Request, env_id: str) -> Response:
    async def work(compat: CompatState, tenant: str, internal: str, env: SwerexEnv) -> dict[str, Any]:
        cpu = env_cpu(compat.api, internal)
        for name in list(env.sessions):
            await asyncio.to_thread(cpu.close_session, env.sessions.pop(name))
        compat.swerex_envs.pop(internal, None)
        compat.api.sessions.pop(internal, None)
        compat.api.controller.release_env(internal)  # the runtime is over, as SWE-ReX's close ends its server
        return {}

    return await _face(request, env_id, work)
