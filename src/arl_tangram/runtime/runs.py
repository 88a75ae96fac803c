"""Shell: how each kind of live action runs on its manager, and what its result says.

Called by ``LiveExecutor`` on the controller's event loop; blocking manager calls go through
the executor's worker threads. Each runner returns the action's result and the execution
time its manager measured (the rest of the action completion time is overhead).

A remote node's manager may hand a large output over by reference (``LazyOutput``): an exec
result's ``held_outputs`` (stream name -> reference, that stream left empty), or a service's
output itself. The result keeps the reference in ``held``; the bytes stay on the node.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.decisions import StartAction
from arl_tangram.managers.api.results import ApiRequest
from arl_tangram.runtime.actions import (
    ActionRecord,
    ActionResult,
    ApiPayload,
    ExecPayload,
    LazyOutput,
    ServicePayload,
)
from arl_tangram.runtime.blocking import BlockingRunner

if TYPE_CHECKING:
    from arl_tangram.managers.cpu.preempt import RunHandle


class RunHost(BlockingRunner, Protocol):
    """What running an action needs of the executor (``LiveExecutor`` is one)."""

    @property
    def memory_pause(self) -> bool: ...

    @property
    def replica_ready(self) -> dict[str, asyncio.Future[str | None]]: ...

    def memory_paused_reporter(self, d: StartAction) -> Callable[[int], None]: ...


async def run_exec(
    ex: RunHost, agent: NodeAgent, record: ActionRecord, d: StartAction, p: ExecPayload, cancel: threading.Event,
    handle: RunHandle | None = None,
) -> tuple[ActionResult, float]:
    """A command in the env's sandbox (or one of its sessions) with exactly the decision's
    grant: its millicores, split over NUMA domains as the decision names, at its DoP."""
    cpu = agent.cpu
    if cpu is None:
        raise RuntimeError(f"node {d.node_id} has no CPU manager")
    # a packed run (``core.packing``) is limited to its whole demand on the cpus the manager
    # picks (least loaded): the NUMA split the ledger charged is of the smaller charge
    packed = d.cpu_limit_millicores is not None
    grant: dict[str, Any] = {
        "millicores": d.cpu_limit_millicores if packed else d.grant.cpu_millicores,
        "numa_millicores": None if packed else d.numa_millicores or None,
        "dop": d.dop,
    }
    common: dict[str, Any] = {"timeout_s": p.timeout_s, "cancel": cancel, **grant}
    memory: dict[str, Any] = {}
    if d.mem_limit_bytes is not None:  # memory per action: pause at the grant, the core decides
        memory["mem_limit_bytes"] = d.mem_limit_bytes
        if ex.memory_pause:
            memory["on_memory_paused"] = ex.memory_paused_reporter(d)
    if p.session_id is not None:
        if not isinstance(p.command, str):
            raise TypeError("a session runs a bash command string, not an argv")
        res = await ex.blocking(cpu.run_in_session, p.session_id, p.command, **common)
    else:
        env = dict(p.env) if p.env else None
        loop = asyncio.get_running_loop()

        def on_output(stream: str, chunk: bytes) -> None:  # the pumping thread: hop to the loop
            loop.call_soon_threadsafe(record.add_output, stream, chunk)

        res = await ex.blocking(
            cpu.exec, record.spec.binding.name, p.command, env=env, cwd=p.cwd, stdin=p.stdin,
            on_output=on_output, handle=handle, **common, **memory,
        )  # fmt: skip
    outcome = str(getattr(res.outcome, "value", res.outcome))
    result = ActionResult(
        record.spec.action_id, record.spec.kind, outcome, exit_code=res.exit_code,
        stdout=res.stdout_text, stderr=res.stderr_text, cause=res.error,
        stdout_truncated=res.stdout_truncated, stderr_truncated=res.stderr_truncated,
        cpu_s=res.cpu_s, peak_mem_bytes=res.peak_mem_bytes, held=dict(getattr(res, "held_outputs", None) or {}),
        paused_s=float(getattr(res, "paused_s", 0.0)),
    )  # fmt: skip
    footprint = getattr(res, "footprint_bytes", None)
    record.footprint_bytes = None if footprint is None else int(footprint)
    return result, float(res.wall_s)


async def run_service(
    ex: RunHost, agent: NodeAgent, record: ActionRecord, d: StartAction, p: ServicePayload,
    cancel: threading.Event | None = None,
) -> tuple[ActionResult, float]:  # fmt: skip
    """A request to the replica the decision names, once that replica has loaded.

    A generation (a request with ``"stream": true``) reports each decoded token as it
    comes: one JSON event per chunk of the record's live output (stream ``"event"``), which
    the OpenAI face turns into server-sent events. ``cancel`` ends a generation at its next
    decode step (the action's cancellation)."""
    gpu = agent.gpu
    if gpu is None or d.replica_id is None:
        raise RuntimeError(f"node {d.node_id} has no GPU manager, or no replica was named")
    ready = ex.replica_ready.get(d.replica_id)
    if ready is not None:
        failure = await asyncio.shield(ready)
        if failure is not None:
            return ActionResult(d.action_id, record.spec.kind, "error", cause=f"replica_failed: {failure}"), 0.0
    started = time.monotonic()
    on_event = None
    if isinstance(p.request, dict) and p.request.get("stream") is True:
        loop = asyncio.get_running_loop()

        def on_event(event: dict[str, Any]) -> None:  # the decoding thread: hop to the loop
            loop.call_soon_threadsafe(record.add_output, "event", json.dumps(event).encode())

    if on_event is None and cancel is None:
        output: Any = await ex.blocking(gpu.run, d.replica_id, p.request)
    else:
        output = await ex.blocking(gpu.run, d.replica_id, p.request, on_event, cancel)
    exec_s = time.monotonic() - started
    if isinstance(output, LazyOutput):  # left on its node: see the module docstring
        return ActionResult(d.action_id, record.spec.kind, "succeeded", held={"output": output}), exec_s
    return ActionResult(d.action_id, record.spec.kind, "succeeded", output=output), exec_s


async def run_api(agent: NodeAgent, record: ActionRecord, p: ApiPayload) -> tuple[ActionResult, float]:
    """A call to the bound provider; waiting for a key's quota counts as overhead."""
    api = agent.api
    if api is None:
        raise RuntimeError("no API manager")
    started = time.monotonic()
    request = ApiRequest(p.method, p.path, p.json, dict(p.params) or None)
    res = await api.call(record.spec.binding.name, request, tokens=p.tokens, timeout_s=p.timeout_s)
    result = ActionResult(
        record.spec.action_id, record.spec.kind, res.outcome, exit_code=res.status, output=res.body, cause=res.cause,
    )  # fmt: skip
    return result, max(0.0, time.monotonic() - started - res.waited_s)
