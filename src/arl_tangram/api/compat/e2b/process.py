"""Shell: envd's ``process.Process`` service: every command is an exec action.

``Start`` submits ``/bin/bash -l -c <cmd>`` (what ``commands.run`` sends) as one exec action
on the sandbox's env, built exactly like a native ``/v1/actions`` exec (so it gets the same
per-action cores, queueing and outcomes): cores from the ``TANGRAM_CPU`` variable of the
command (``"n"`` / ``"min-max"``), else the sandbox's ``cpu`` metadata, else ``[e2b] cpu``;
its timeout is the call's deadline (``Connect-Timeout-Ms``: the SDK's ``timeout``, 60 s by
default; none: ``MAX_TIMEOUT_S``); envs are the sandbox's ``envVars`` under the command's.
The stream sends the start event (a pid the face hands out), the output as the command
produces it, then the end event (exit code; a killed command ends ``exited=false``,
``signal: killed``) or, when it ran past its timeout, ``deadline_exceeded`` (the SDK's
``TimeoutException``). A client that goes away does not stop the command (E2B's
background commands); ``SendSignal`` (SIGKILL or SIGTERM) cancels its action. ``user`` is
accepted and ignored: every command runs as the sandbox's one unprivileged user. Stdin is at
EOF (``stdin=True`` is accepted; ``SendInput``/``StreamInput`` then fail
``failed_precondition``, ``CloseStdin`` succeeds); PTYs are not served.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from protobuf import Oneof

from arl_tangram.api.build import build
from arl_tangram.api.compat.e2b.connect import ConnectError, end_stream, timeout_s_of
from arl_tangram.api.compat.e2b.envd import server_stream, unary
from arl_tangram.api.compat.e2b.sandboxes import E2bProcess, E2bSandbox, E2bState
from arl_tangram.api.schemas import ExecAction
from arl_tangram.runtime.actions import ActionRecord, read_result
from arl_tangram.runtime.config_e2b import parse_cpu

from e2b.envd.process import process_pb as pb  # isort: skip  # the message classes the SDK ships

router = APIRouter(tags=["e2b-envd"], include_in_schema=False)
MAX_TIMEOUT_S = 86400.0
KEEPALIVE_S = 50.0  # an idle stream's heartbeat (envd's own interval is of that order)
CPU_VARIABLE = "TANGRAM_CPU"


def _submit(e2b: E2bState, sb: E2bSandbox, config: Any, timeout_s: float | None) -> ActionRecord:
    envs = {**sb.env_vars, **dict(config.envs)}
    lo, hi = parse_cpu(envs[CPU_VARIABLE], f"envs.{CPU_VARIABLE}") if CPU_VARIABLE in envs else sb.cpu
    body = ExecAction.model_validate({
        "type": "exec", "env_id": sb.sandbox_id, "command": [config.cmd or "/bin/bash", *config.args], "env": envs or None,
        "cwd": config.cwd if config.has_field("cwd") and config.cwd else None, "kind": "e2b:command",
        "timeout_s": min(timeout_s or MAX_TIMEOUT_S, MAX_TIMEOUT_S), "cpu": {"min": lo, "max": hi},
    })  # fmt: skip
    spec, payload, _ = build(e2b.api, sb.tenant, body)
    return e2b.api.submit(spec, payload, None)


def _event(which: str, value: Any, reply: type = pb.StartResponse) -> Any:
    return reply(event=pb.ProcessEvent(event=Oneof(which, value)))  # type: ignore[arg-type]  # which: a field name of the oneof


def _data(stream: str, text: str, reply: type) -> Any:
    return _event("data", pb.ProcessEvent.DataEvent(output=Oneof(stream, text.encode())), reply)  # type: ignore[arg-type]


def _end(outcome: str, exit_code: int | None, cause: str | None) -> Any:
    if outcome in ("succeeded", "failed") and exit_code is not None:
        return pb.ProcessEvent.EndEvent(exit_code=exit_code, exited=True, status=f"exit status {exit_code}")
    if outcome == "oom_killed":
        return pb.ProcessEvent.EndEvent(exit_code=137, exited=False, status="signal: killed", error="oom_killed: past the sandbox's memory limit")
    if outcome == "cancelled":
        return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="signal: killed", error=cause or "cancelled")
    raise ConnectError("internal" if outcome == "error" else "unavailable", f"the command ended {outcome}: {cause or ''}")


async def _events(e2b: E2bState, proc: E2bProcess, reply: type) -> AsyncIterator[Any]:
    """Start, the output while it is produced, the rest with the result, the end."""
    record = proc.record
    yield _event("start", pb.ProcessEvent.StartEvent(pid=proc.pid), reply)
    sent, chars = 0, {"stdout": 0, "stderr": 0}
    while record.result is None:
        for stream, text in record.live_output[sent:]:
            chars[stream] = chars.get(stream, 0) + len(text)
            yield _data(stream, text, reply)
        sent = len(record.live_output)
        changed = record.live_output_changed  # taken before the wait: no chunk is missed
        if len(record.live_output) > sent or record.result is not None:
            continue
        waiter = asyncio.ensure_future(changed.wait())
        try:
            done, _ = await asyncio.wait((record.done, waiter, e2b.api.stopping), timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not done:
            yield _event("keepalive", pb.ProcessEvent.KeepAlive(), reply)
        elif e2b.api.stopping in done and record.result is None:
            raise ConnectError("unavailable", "the server is stopping")
    result = await read_result(record)
    for stream, text in record.live_output[sent:]:  # what came in with the end
        chars[stream] = chars.get(stream, 0) + len(text)
        yield _data(stream, text, reply)
    for stream, full in (("stdout", result.stdout), ("stderr", result.stderr)):
        if len(full) > chars[stream]:  # past LIVE_OUTPUT_BYTES: the rest arrives with the result
            yield _data(stream, full[chars[stream] :], reply)
    if result.outcome == "timed_out":
        raise ConnectError("deadline_exceeded", f"the command ran past its timeout ({record.spec.timeout_s:g} s) and was killed")
    yield _event("end", _end(result.outcome, result.exit_code, result.cause), reply)


def _selected(sb: E2bSandbox, selector: Any) -> E2bProcess:
    chosen = selector.selector if selector is not None else None
    for proc in sb.processes.values():
        if chosen is not None and ((chosen.field == "pid" and proc.pid == chosen.value) or (chosen.field == "tag" and proc.tag == chosen.value)):
            return proc
    raise ConnectError("not_found", f"process with {chosen.field if chosen else 'pid'} {chosen.value if chosen else '?'!r} not found")


@router.post("/process.Process/Start")
async def start(request: Request) -> Response:
    timeout_s = timeout_s_of(request) if "connect-timeout-ms" in request.headers else None

    async def opener(e2b: E2bState, sb: E2bSandbox, message: Any, codec: str) -> AsyncIterator[Any]:
        if message.process is None:
            raise ConnectError("invalid_argument", "process: is required")
        if message.has_field("pty") and message.pty is not None:
            raise ConnectError("unimplemented", "pty: ARL-Tangram sandboxes run commands without a terminal")
        record = _submit(e2b, sb, message.process, timeout_s)
        cfg = message.process
        tag = message.tag if message.has_field("tag") else None
        proc = E2bProcess(e2b.new_pid(sb), tag, cfg.cmd, tuple(cfg.args), dict(cfg.envs), cfg.cwd or None, record, bool(message.stdin))
        sb.processes[proc.pid] = proc
        record.done.add_done_callback(lambda _f: _ended(e2b, sb, proc))
        return _events(e2b, proc, pb.StartResponse)

    return await server_stream(request, pb.StartRequest, opener)


def _ended(e2b: E2bState, sb: E2bSandbox, proc: E2bProcess) -> None:
    sb.processes.pop(proc.pid, None)
    e2b.api.ack(proc.record)  # the streams hold the record; the store need not keep it


@router.post("/process.Process/Connect")
async def connect_process(request: Request) -> Response:
    async def opener(e2b: E2bState, sb: E2bSandbox, message: Any, codec: str) -> AsyncIterator[Any]:
        return _events(e2b, _selected(sb, message.process), pb.ConnectResponse)

    return await server_stream(request, pb.ConnectRequest, opener)


@router.post("/process.Process/List")
async def list_processes(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, message: Any) -> Any:
        infos = [
            pb.ProcessInfo(config=pb.ProcessConfig(cmd=p.cmd, args=list(p.args), envs=p.envs, cwd=p.cwd), pid=p.pid, tag=p.tag)
            for p in sorted(sb.processes.values(), key=lambda p: p.pid)
        ]  # fmt: skip
        return pb.ListResponse(processes=infos)

    return await unary(request, pb.ListRequest, work)


@router.post("/process.Process/SendSignal")
async def send_signal(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, message: Any) -> Any:
        proc = _selected(sb, message.process)
        if message.signal not in (pb.Signal.SIGKILL, pb.Signal.SIGTERM):
            raise ConnectError("invalid_argument", f"signal: must be SIGKILL or SIGTERM (got {message.signal})")
        e2b.api.controller.cancel(proc.record.spec.action_id)
        return pb.SendSignalResponse()

    return await unary(request, pb.SendSignalRequest, work)


@router.post("/process.Process/CloseStdin")
async def close_stdin(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, message: Any) -> Any:
        _selected(sb, message.process)  # stdin is at EOF already
        return pb.CloseStdinResponse()

    return await unary(request, pb.CloseStdinRequest, work)


STDIN_RULE = "stdin: ARL-Tangram runs a command with its stdin at EOF; pass input in the command (a file or a pipe)"


@router.post("/process.Process/SendInput")
async def send_input(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, message: Any) -> Any:
        _selected(sb, message.process)
        raise ConnectError("failed_precondition", STDIN_RULE)

    return await unary(request, pb.SendInputRequest, work)


@router.post("/process.Process/StreamInput")
async def stream_input(request: Request) -> Response:
    return Response(end_stream(ConnectError("failed_precondition", STDIN_RULE)), 200, media_type="application/connect+json")


@router.post("/process.Process/Update")
async def update(request: Request) -> Response:
    async def work(e2b: E2bState, sb: E2bSandbox, message: Any) -> Any:
        raise ConnectError("unimplemented", "pty: ARL-Tangram sandboxes run commands without a terminal")

    return await unary(request, pb.UpdateRequest, work)
