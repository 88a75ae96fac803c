"""Shell: the SandboxFusion face: ``POST /run_code``, ``POST /run_jupyter``, ``GET /v1/ping``.

Wire format: PROTOCOLS.md (the ``sandbox-fusion`` client's models; unknown fields ignored).
Each call is stateless: it borrows a warm sandbox of its tenant and memory size from the
pool, writes the code and ``files``, runs the compile step (``compile_result``) and the
program (``run_result``) each as one scheduled single-core action, reads ``fetch_files``,
and gives the sandbox back to be reset. Status rules (verl's client depends on them):
- the program failed or ran out of time -> HTTP 200, ``Failed`` (``TimeLimitExceeded``);
- an infrastructure fault (a sandbox that would not start, a run the runtime ended
  ``error``/``cancelled``) -> HTTP 200, ``SandboxError`` with the cause as ``message``;
- overload (no sandbox frees in time, the queue or a tenant limit is full) -> 504 with
  ``Retry-After``, the one status verl retries;
- an invalid body, a language this host cannot run, bad base64 -> 422 naming the field.
Deadline rule (``deadline_end``): verl's client gives a call ``compile_timeout +
run_timeout + 10`` s (its ``API_TIMEOUT``) including queue time, then scores it a sandbox
error. We answer by that budget less ``DEADLINE_SLACK_S``: waiting for a sandbox is bounded
by it, the compile step must start while the compile and the run still fit, the run while
``run_timeout`` still fits (``ActionSpec.deadline_s``; the core ends a run that cannot
start in time ``rejected``/``deadline:``); each miss is a 504, which verl retries. A call
not answered ``ANSWER_BY_MARGIN_S`` before verl's read timeout (a program forked late, its
launcher's cgroup joins queued on the kernel's lock) is answered 504 then and its run
cancelled (``answer_by``): verl retries a 504, while a read timeout is a wrong verdict. A retry
(the same call again, ``compat.retries``) waits in its pool bucket's retry line, served
before first attempts, so a test case turned away once is not turned away again for being
back at the end of the line.
Timeouts: ``run_timeout`` (and ``compile_timeout``) is wall time from the step's start,
as SandboxFusion's own; preemption (``core.preemption``) lowers a long run's CPU priority
but never pauses its clock, so a looping program dies at its timeout whatever it was
granted.
Served at the root for an unauthenticated server's ``default`` tenant and under
``/t/<token>/`` for a token's tenant (``/v1/ping`` too). Output past the CPU manager's cap
is cut: the step's ``stdout_truncated`` / ``stderr_truncated`` say so (fields the client's
models ignore) and its stderr ends with a ``[truncated: ...]`` line. A run whose client
closed the connection before the answer is cancelled at once; once it has ended, its
sandbox is reset and reused (one that does not end within ``pool.SETTLE_S``, or a call
cancelled outside its run, retires its sandbox).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from arl_tangram.api.client_gone import wait_unless_gone
from arl_tangram.api.compat import long_programs, retries
from arl_tangram.api.compat.languages import resolve
from arl_tangram.api.compat.pool import ActionCancelled, env_cpu, run_env_action
from arl_tangram.api.compat.tenancy import CompatState, Unauthorized, compat_state, tenant_for
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.state import Overloaded
from arl_tangram.core.errors import SpecError
from arl_tangram.core.preemption import DEADLINE_PREFIX
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ExecPayload
from arl_tangram.runtime.controller import EnvFailedError

MAX_TIMEOUT_S = 3600.0
VERL_CLIENT_MARGIN_S = 10.0  # verl 0.9.1's API_TIMEOUT: its read timeout is compile + run + this
DEADLINE_SLACK_S = 3.0  # our answer (a 504 included) must reach the client before it gives up
#: a call not answered this long before verl's read timeout is answered 504 then (and its
#: run cancelled): verl retries a 504, while a read timeout is a wrong verdict
ANSWER_BY_MARGIN_S = 2.0  # assumption: covers the accept lag of a 768-request burst (1 s did not, measured)
MAX_FILES = 1000
WORKSPACE = "/workspace"
router = APIRouter(tags=["sandboxfusion"], route_class=JsonBodyRoute)  # its contract is SandboxFusion's; documented in /openapi.json under its tag


class RunCodeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    compile_timeout: float = Field(10.0, gt=0, le=MAX_TIMEOUT_S)
    run_timeout: float = Field(10.0, gt=0, le=MAX_TIMEOUT_S)
    memory_limit_MB: int = -1  # noqa: N815 (the wire name)
    code: str
    stdin: str | None = None
    language: str = "python"
    files: dict[str, str | None] = Field(default_factory=dict, max_length=MAX_FILES)
    fetch_files: list[str] = Field(default_factory=list, max_length=MAX_FILES)


def command_result(r: ActionResult) -> dict[str, Any]:
    """An action's result as a SandboxFusion ``CommandRunResult``."""
    stderr = r.stderr
    if r.outcome in ("succeeded", "failed"):
        status, code = "Finished", r.exit_code
    elif r.outcome == "timed_out":
        status, code = "TimeLimitExceeded", r.exit_code
    elif r.outcome == "oom_killed":  # the program's fault, as SandboxFusion reports it
        status, code = "Finished", r.exit_code if r.exit_code not in (None, 0) else 137
        stderr += "\n[killed: the memory limit was exceeded]"
    else:
        status, code = "Error", r.exit_code
        stderr = f"{stderr}\n{r.cause or r.outcome}".lstrip("\n")
    for stream, cut in (("stdout", r.stdout_truncated), ("stderr", r.stderr_truncated)):
        if cut:  # stdout stays byte-exact (graders compare it); the sign goes to stderr
            stderr += f"\n[truncated: {stream} exceeded the output cap; the rest was dropped]"
    return {
        "status": status, "execution_time": r.exec_s, "cpu_time": r.cpu_s, "return_code": code,
        "stdout": r.stdout, "stderr": stderr,
        "stdout_truncated": r.stdout_truncated, "stderr_truncated": r.stderr_truncated,
    }  # fmt: skip


def overall_status(*steps: dict[str, Any] | None) -> tuple[str, str]:
    """(status, message) by SandboxFusion's rule: an ``Error`` step -> SandboxError;
    else a timeout or a non-zero return code -> Failed; else Success."""
    ran = [s for s in steps if s is not None]
    for s in ran:
        if s["status"] == "Error":
            return "SandboxError", s["stderr"] or "the sandbox failed"
    for s in ran:
        if s["status"] == "TimeLimitExceeded" or s["return_code"] != 0:
            return "Failed", ""
    return "Success", ""


def decode_files(files: dict[str, str | None]) -> dict[str, bytes]:
    """``files`` as bytes by path (a ``null`` content is skipped); ``SpecError`` naming the path."""
    out: dict[str, bytes] = {}
    for path, content in files.items():
        if content is None:
            continue
        try:
            out[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise SpecError(f"files[{path}]", "must be base64", content[:32]) from None
    return out


def mem_bytes_of(compat: CompatState, memory_limit_mb: int) -> int:
    if memory_limit_mb <= 0:
        return compat.settings.default_mem_bytes
    mem_bytes = memory_limit_mb << 20
    largest = compat.api.max_env_mem_bytes()
    if mem_bytes < 16 << 20 or mem_bytes > largest:
        raise SpecError("memory_limit_MB", f"must be -1 or between 16 and {largest >> 20}", memory_limit_mb)
    return mem_bytes


def _step(argv: tuple[str, ...], stdin: str | None, timeout_s: float, cwd: str | None = None) -> ExecPayload:
    return ExecPayload(argv, stdin.encode() if stdin is not None else None, (), cwd, timeout_s)


async def _write(compat: CompatState, env_id: str, files: dict[str, bytes]) -> None:
    cpu = env_cpu(compat.api, env_id)
    for path, data in files.items():
        await asyncio.to_thread(cpu.write_file, env_id, path, data)


async def fetch(compat: CompatState, env_id: str, paths: list[str], cwd: str | None = None) -> dict[str, str]:
    """The ``fetch_files`` that exist, base64, by the path the request gave (a relative one
    under ``cwd`` when set); a missing or unreadable one is left out."""
    cpu = env_cpu(compat.api, env_id)
    out: dict[str, str] = {}
    for path in paths:
        try:
            out[path] = base64.b64encode(await asyncio.to_thread(cpu.read_file, env_id, _in_workspace(path, cwd))).decode()
        except Exception:  # noqa: BLE001 - SandboxFusion omits files it cannot fetch
            continue
    return out


async def run_code(compat: CompatState, tenant: str, body: RunCodeRequest) -> dict[str, Any]:
    """One stateless code run (see the module docstring); raises ``Overloaded`` (-> 504),
    ``SpecError``/``UnknownLanguage`` (-> 422). A call answered 504, or cancelled (its
    client went away, or no answer was ready by ``answer_by``: a 504), is remembered, so
    its retry is served first (``compat.retries``)."""
    call = retries.key(tenant, body)
    try:
        return await _run_code(compat, tenant, body, compat.retries.take(call))
    except (Overloaded, asyncio.CancelledError):
        compat.retries.note(call)
        raise


async def _run_code(compat: CompatState, tenant: str, body: RunCodeRequest, retry: bool) -> dict[str, Any]:
    place = resolve(body.language, compat.api.runtime.config.sandboxfusion.language_images)
    lang, image = place.language, place.image
    files = decode_files(body.files)
    mem_bytes = mem_bytes_of(compat, body.memory_limit_MB)
    end = deadline_end(body, time.monotonic())
    program, programs = long_programs.key(tenant, body), compat.long_programs
    try:
        env_id = await compat.pool.acquire(
            tenant, mem_bytes, end - time.monotonic() - body.run_timeout, image=image, retry=retry,
            long=lambda: programs.is_long(program),
            probing=(lambda: programs.is_probing(program)) if _preempting(compat) else None,
        )  # fmt: skip
    except EnvFailedError as exc:
        return _sandbox_error(str(exc))
    probe = programs.start(program)
    reusable = False
    # an image's WorkingDir may be anywhere; runs there use the workspace the pool resets
    cwd = None if image == "host" else WORKSPACE
    try:
        await _write(compat, env_id, {_in_workspace(p, cwd): data for p, data in {**files, lang.source: body.code.encode()}.items()})
        compiled = run = None
        if lang.compile is not None:
            r = await _run_step(compat, tenant, env_id, f"sf:compile:{lang.name}", _step(lang.compile, None, body.compile_timeout, cwd), end - body.run_timeout)
            compiled = command_result(r)
        if compiled is None or (compiled["status"] == "Finished" and compiled["return_code"] == 0):
            # a program seen long lately is declared so (its whole timeout): the core then
            # demotes its run at the floor quantum instead of after the cap, and walks it after
            # the short ones (``preemption.quantum_of``; its verdict is unchanged: a timeout
            # is wall time from the start, demoted or not)
            known_long = body.run_timeout if programs.is_long(program) else None
            step = _step(lang.run, body.stdin, body.run_timeout, cwd)
            r = await _run_step(compat, tenant, env_id, f"sf:run:{lang.name}", step, end, probe.watch, known_long)
            probe.end(long=r.outcome == "timed_out")
            run = command_result(r)
        status, message = overall_status(compiled, run)
        fetched = await fetch(compat, env_id, body.fetch_files, cwd) if body.fetch_files else {}
        reusable = status != "SandboxError"
        return {
            "status": status, "message": message, "compile_result": compiled, "run_result": run,
            "executor_pod_name": r.node_id, "files": fetched,
        }  # fmt: skip
    except Overloaded:
        # a step that could not start in time never ran: the env is as clean as after any
        # call (retiring it cost a sandbox's destruction and creation, 63 of them in one
        # 256-call run, each taking the kernel's cgroup lock every launch waits for)
        reusable = True
        raise
    except ActionCancelled:
        # the client went away during a step, which has ended since: the env is reset and
        # reused like any other (retiring it would cost a new sandbox's creation under the
        # very load that made clients give up)
        reusable = True
        raise
    finally:
        probe.end()
        compat.pool.release(tenant, mem_bytes, env_id, reusable=reusable, image=image)


def _preempting(compat: CompatState) -> bool:
    """Whether the core demotes long runs (``preempt_quantum_s`` set): only then can a
    program's probe tell that it is long before it times out (``compat.long_programs``)."""
    return getattr(compat.api.controller.scheduler.policy, "preempt_quantum_s", None) is not None


def _in_workspace(path: str, cwd: str | None) -> str:
    """A request's relative path, absolute under ``cwd`` on an image env (as it is relative
    to the workspace on the host root)."""
    return path if cwd is None or path.startswith("/") else f"{cwd}/{path}"


def deadline_end(body: RunCodeRequest, arrived: float) -> float:
    """When (monotonic) the call's answer is due: verl's read timeout less our slack."""
    return arrived + body.compile_timeout + body.run_timeout + VERL_CLIENT_MARGIN_S - DEADLINE_SLACK_S


def answer_by(body: RunCodeRequest) -> float:
    """Seconds from now within which the call is answered, a 504 if its run has not ended:
    ``ANSWER_BY_MARGIN_S`` before verl's read timeout. A run that started in time (by
    ``deadline_end``'s rule) ends before then unless its program was forked late (its
    launcher's cgroup joins queued on the kernel's lock), and then verl would score it a
    sandbox error; a 504 is retried instead (first in line)."""
    return body.compile_timeout + body.run_timeout + VERL_CLIENT_MARGIN_S - ANSWER_BY_MARGIN_S


async def _run_step(
    compat: CompatState, tenant: str, env_id: str, kind: str, step: ExecPayload, end: float,
    watch: Callable[[ActionRecord], None] | None = None, t_ori_s: float | None = None,
) -> ActionResult:  # fmt: skip
    """One step, which must have ended by ``end`` (monotonic); one that cannot start in time
    raises ``Overloaded`` (-> 504, which verl retries) instead of running into verl's timeout.
    ``watch``: given the step's action record (``compat.long_programs``); ``t_ori_s``: its
    declared length (None: learned per kind)."""
    deadline_s = end - time.monotonic()
    if deadline_s <= step.timeout_s:
        raise Overloaded(f"{DEADLINE_PREFIX} no time left to run this step before the client's timeout", 1.0)
    r = await run_env_action(compat.api, tenant, env_id, kind, step, deadline_s, settle=True, watch=watch, t_ori_s=t_ori_s)
    if r.outcome == "rejected" and (r.cause or "").startswith(DEADLINE_PREFIX):
        raise Overloaded(r.cause or DEADLINE_PREFIX, 1.0)
    return r


def _sandbox_error(message: str) -> dict[str, Any]:
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None, "executor_pod_name": None, "files": {}}


def overloaded_response(exc: Exception) -> JSONResponse:
    retry_after_s = getattr(exc, "retry_after_s", None) or 1.0
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    return JSONResponse({"detail": f"overloaded, retry: {exc}"}, status_code=504, headers=headers)


async def serve(request: Request, work: Any, answer_by_s: float | None = None) -> Any:
    """Tenant, then ``work(compat, tenant)`` as a task of its own (a client that goes away
    does not strand a borrowed sandbox: the task is cancelled, which cancels its action and
    gives the sandbox back); overload, or no answer within ``answer_by_s`` (the task is then
    cancelled as well) -> 504, no credential -> 401."""
    compat = compat_state(request)
    try:
        tenant = tenant_for(compat.api, request.path_params.get("token"))
    except Unauthorized as exc:
        return JSONResponse({"detail": f"{exc}; SandboxFusion callers put it in the path: /t/<token>/run_code"}, 401)
    task = compat.api.spawn(work(compat, tenant))
    try:
        if not await wait_unless_gone(request, task, answer_by_s):
            task.cancel()  # nobody reads this run's answer: stop it now
            return Response(status_code=499)
        if not task.done():
            task.cancel()  # too late to answer before the client's timeout: it retries a 504
            return overloaded_response(Overloaded(f"{DEADLINE_PREFIX} no answer before the client's timeout", 1.0))
        return task.result()
    except Overloaded as exc:
        return overloaded_response(exc)
    except Exception as exc:
        if type(exc).__name__ in ("OverloadedError", "TenantLimitError"):
            return overloaded_response(exc)
        raise


@router.get("/v1/ping")
@router.get("/t/{token}/v1/ping")
async def ping(request: Request) -> Any:
    """``"pong"``; under ``/t/<token>/`` only for a token the server knows (401 else)."""
    if "token" in request.path_params:
        try:
            tenant_for(compat_state(request).api, request.path_params["token"])
        except Unauthorized as exc:
            return JSONResponse({"detail": str(exc)}, 401)
    return "pong"


@router.post("/run_code")
@router.post("/t/{token}/run_code")
async def run_code_route(request: Request, body: RunCodeRequest) -> Any:
    return await serve(request, lambda compat, tenant: run_code(compat, tenant, body), answer_by(body))
