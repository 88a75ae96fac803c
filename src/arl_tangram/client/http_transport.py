"""Shell: the SDK's remote transport: the same ``AsyncClient`` over the ``/v1`` HTTP API.

One keep-alive ``httpx.AsyncClient`` per transport. An action is one POST that waits
(``wait_s``) and, for long actions, long polls on ``/wait`` until it is done; the action id
is also the ``Idempotency-Key``, so a POST retried after a dropped connection never runs the
action twice. Cancelling the awaiting task (or a call's ``timeout_s``) cancels the action on
the server, as in process; ``aclose`` cancels the calls still in flight, waits for their
outcomes and releases the envs this client created and did not release (in process, closing
the client closes the whole system). Errors: 4xx answers raise ``SpecError`` naming the
server's field and rule; an env whose sandbox failed raises ``EnvFailedError``.

``service_spec`` and ``has_provider`` are synchronous in the SDK, so they read a catalog the
transport fetches at connect and after each registration: a service that another client
registers later is seen after the next registration or ``refresh()``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from arl_tangram.client.transport import Transport
from arl_tangram.core.action import ActionSpec, EnvSpec, ServiceSpec
from arl_tangram.core.elasticity import Amdahl, Learned, Table
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import (
    ActionResult,
    ApiPayload,
    ExecPayload,
    NoopPayload,
    Payload,
    ServicePayload,
)
from arl_tangram.runtime.codec import result_from_dict
from arl_tangram.runtime.config import ServiceConfig
from arl_tangram.runtime.controller import EnvFailedError

LONG_POLL_S = 20.0  # one wait request; the HTTP read timeout is above it
MAX_OVERLOAD_RETRIES = 5
CLOSE_WAIT_S = 20.0


class HttpError(RuntimeError):
    """An answer the SDK has no better exception for (401, 5xx); ``status`` and ``body``."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body.get('error') if isinstance(body, dict) else body}")


class HttpTransport(Transport):
    """``AsyncClient(await HttpTransport.connect("http://host:port", token="..."))``."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.services: dict[str, ServiceSpec] = {}
        self.providers: set[str] = set()
        self.learned: dict[str, Learned] = {}
        self.in_flight: set[str] = set()
        self.envs: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @classmethod
    async def connect(cls, url: str, token: str | None = None, *, timeout_s: float = 120.0) -> HttpTransport:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0, read=max(timeout_s, LONG_POLL_S + 30.0)),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=512),
        )  # fmt: skip
        transport = cls(http)
        try:
            await transport.refresh()
        except BaseException:
            await http.aclose()
            raise
        return transport

    async def refresh(self) -> None:
        """Fetch the catalog of services and providers this tenant may call."""
        services = (await self._call("GET", "/v1/services"))["services"]
        self.services = {s["name"]: ServiceSpec(s["name"], s["weight_bytes"], s["devices_min"], s["devices_max"]) for s in services}
        self.providers = {p["name"] for p in (await self._call("GET", "/v1/providers"))["providers"]}

    # -- plumbing -------------------------------------------------------------------------
    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; a 503 (overload) is retried after its ``Retry-After`` (a few times).
        A 429 (a tenant limit) raises ``SpecError`` at once, as in process."""
        for attempt in range(MAX_OVERLOAD_RETRIES + 1):
            response = await self.http.request(method, path, **kwargs)
            if response.status_code == 503 and "retry-after" in response.headers and attempt < MAX_OVERLOAD_RETRIES:
                await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                continue
            return _answer(response)
        raise AssertionError("unreachable")

    # -- actions --------------------------------------------------------------------------
    async def run_action(self, spec: ActionSpec, payload: Payload, timeout_s: float | None = None) -> ActionResult:
        action_id = spec.action_id
        body = encode_action(spec, payload)
        self.in_flight.add(action_id)
        self._idle.clear()
        try:
            async with asyncio.timeout(timeout_s):
                view = await self._submit(action_id, body)
                while view["state"] != "done":
                    view = await self._call("GET", f"/v1/actions/{action_id}/wait", params={"timeout_s": LONG_POLL_S})
        except (asyncio.CancelledError, TimeoutError):
            await self._cancel(action_id)
            raise
        finally:
            self.in_flight.discard(action_id)
            if not self.in_flight:
                self._idle.set()
        return decode_result(view)

    async def _submit(self, action_id: str, body: dict[str, Any]) -> Any:
        headers = {"Idempotency-Key": action_id}
        for attempt in range(3):
            try:
                return await self._call("POST", "/v1/actions", json=body, params={"wait_s": LONG_POLL_S}, headers=headers)
            except httpx.TransportError:  # the same key: a retry never runs it twice
                if attempt == 2:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _cancel(self, action_id: str) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server is gone: nothing left to cancel
            await self.http.post(f"/v1/actions/{action_id}/cancel")

    # -- envs, files, sessions ------------------------------------------------------------
    async def create_env(self, spec: EnvSpec) -> None:
        body = {
            "env_id": spec.env_id, "image": spec.image, "memory": spec.mem_bytes, "pids_max": spec.pids_max,
            "workspace": spec.workspace_bytes, "tmp": spec.tmp_bytes, "writable": spec.writable_bytes,
            "trajectory_id": spec.trajectory_id,
        }  # fmt: skip
        if spec.snapshot:
            body["snapshot"] = spec.snapshot
        try:
            await self._call("POST", "/v1/envs", json=body)
        except HttpError as exc:
            if exc.status == 503 and isinstance(exc.body, dict) and exc.body.get("field") == "env":
                raise EnvFailedError(exc.body.get("error", "the sandbox failed to start")) from None
            raise
        self.envs.add(spec.env_id)

    # -- snapshots (the server knows the tenant) -------------------------------------------
    async def snapshot(self, env_id: str, tenant: str, name: str | None) -> dict[str, Any]:
        return dict(await self._call("POST", f"/v1/envs/{env_id}/snapshots", json={"name": name}))

    async def fork(self, env_id: str, tenant: str, count: int) -> list[str]:
        answer = await self._call("POST", f"/v1/envs/{env_id}/fork", json={"count": count})
        ids = [str(e["env_id"]) for e in answer["envs"]]
        self.envs.update(ids)
        return ids

    async def rollback(self, env_id: str, tenant: str, snapshot_id: str) -> dict[str, Any]:
        return dict(await self._call("POST", f"/v1/envs/{env_id}/rollback", json={"snapshot_id": snapshot_id}))

    async def get_snapshot(self, snapshot_id: str, tenant: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/snapshots/{snapshot_id}"))

    async def list_snapshots(self, tenant: str) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/snapshots"))["snapshots"])

    async def delete_snapshot(self, snapshot_id: str, tenant: str) -> None:
        await self._call("DELETE", f"/v1/snapshots/{snapshot_id}")

    async def prefetch(self, image: str, nodes: Sequence[str]) -> None:
        await self._call("POST", "/v1/images", json={"reference": image, "nodes": list(nodes)})

    async def release_env(self, env_id: str) -> None:
        self.envs.discard(env_id)
        with contextlib.suppress(SpecError):  # already gone (released, expired): idempotent
            await self._call("DELETE", f"/v1/envs/{env_id}")

    async def write_file(self, env_id: str, path: str, data: bytes) -> None:
        await self._call("PUT", f"/v1/envs/{env_id}/files", params={"path": path}, content=data)

    async def read_file(self, env_id: str, path: str) -> bytes:
        response = await self.http.get(f"/v1/envs/{env_id}/files", params={"path": path})
        if response.status_code == 404 and _field(response) == "path":
            raise FileNotFoundError(response.json().get("error") or f"no such file in the sandbox: {path}")
        if response.status_code != 200:
            _answer(response)
        return response.content

    async def open_session(self, env_id: str, env: Mapping[str, str] | None, cwd: str | None) -> str:
        answer = await self._call("POST", f"/v1/envs/{env_id}/sessions", json={"env": dict(env) if env else None, "cwd": cwd})
        return str(answer["session_id"])

    async def close_session(self, env_id: str, session_id: str) -> None:
        await self._call("DELETE", f"/v1/envs/{env_id}/sessions/{session_id}")

    # -- services and providers ------------------------------------------------------------
    async def register_service(self, service: ServiceConfig) -> ServiceSpec:
        body = {
            "name": service.name, "handler": service.handler, "folder": service.folder, "module": service.module,
            "devices_min": service.devices_min, "devices_max": service.devices_max,
        }  # fmt: skip
        for key in ("max_batch", "max_context_tokens"):  # generate services only
            if getattr(service, key) is not None:
                body[key] = getattr(service, key)
        s = await self._call("POST", "/v1/services", json=body)
        spec = ServiceSpec(s["name"], s["weight_bytes"], s["devices_min"], s["devices_max"])
        await self.refresh()
        return spec

    def service_spec(self, name: str) -> ServiceSpec | None:
        return self.services.get(name)

    def has_provider(self, name: str) -> bool:
        return name in self.providers

    def learned_model(self, kind: str) -> Learned:
        # Only a placeholder: a curve the caller did not state is learned by the server.
        return self.learned.setdefault(kind, Learned())

    async def aclose(self) -> None:
        """Cancel the calls in flight and wait for their outcomes, release the envs left,
        close the connections. Idempotent."""
        if self.http.is_closed:
            return
        try:
            for action_id in sorted(self.in_flight):
                await self._cancel(action_id)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self._idle.wait()
            for env_id in sorted(self.envs):
                with contextlib.suppress(httpx.HTTPError, HttpError, SpecError):
                    await self.release_env(env_id)
        finally:
            await self.http.aclose()


def _field(response: httpx.Response) -> str | None:
    """The ``field`` of an error answer's JSON body, if it has one."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("field") if isinstance(body, dict) else None


def _answer(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; else the exception the SDK raises for it."""
    if response.status_code < 300:
        return response.json() if response.content else None
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if 400 <= response.status_code < 500 and response.status_code != 401 and isinstance(body, dict):
        raise SpecError(body.get("field") or "request", body.get("rule") or body.get("error", ""), body.get("value"))
    raise HttpError(response.status_code, body)


def _cpu(spec: ActionSpec) -> dict[str, Any]:
    cpu: dict[str, Any] = {"min": spec.dop_min, "max": spec.dop_max}
    if isinstance(spec.elasticity, Amdahl):
        cpu["serial_fraction"] = spec.elasticity.serial_fraction
    elif isinstance(spec.elasticity, Table):
        cpu["table"] = list(spec.elasticity.efficiencies)
    return cpu


def encode_action(spec: ActionSpec, payload: Payload) -> dict[str, Any]:
    """The ``/v1/actions`` body of an SDK action (the server sets the tenant)."""
    base: dict[str, Any] = {"action_id": spec.action_id, "trajectory_id": spec.trajectory_id}
    if spec.retryable:
        base["retryable"] = True
    if isinstance(payload, NoopPayload):
        return {**base, "type": "noop", "kind": spec.kind}
    if isinstance(payload, ExecPayload):
        body = {
            **base, "type": "exec", "kind": spec.kind, "env_id": spec.binding.name,
            "command": payload.command if isinstance(payload.command, str) else list(payload.command),
            "env": dict(payload.env) or None, "cwd": payload.cwd, "session_id": payload.session_id,
            "timeout_s": payload.timeout_s, "cpu": _cpu(spec), "t_ori_s": spec.t_ori_s,
        }  # fmt: skip
        if payload.stdin is not None:
            body["stdin_b64"] = base64.b64encode(payload.stdin).decode()
        if spec.memory_bytes is not None:
            body["memory"] = spec.memory_bytes
        if spec.deadline_s is not None:
            body["deadline_s"] = spec.deadline_s
        return body
    if isinstance(payload, ServicePayload):
        return {
            **base, "type": "service", "service": spec.binding.name, "request": payload.request,
            "devices": {"min": spec.dop_min, "max": spec.dop_max}, "timeout_s": spec.timeout_s,
        }  # fmt: skip
    if isinstance(payload, ApiPayload):
        return {
            **base, "type": "api", "provider": spec.binding.name, "method": payload.method, "path": payload.path,
            "json": payload.json, "params": dict(payload.params) or None, "tokens": payload.tokens,
            "timeout_s": payload.timeout_s,
        }  # fmt: skip
    raise TypeError(f"no wire format for {type(payload).__name__}")


def decode_result(view: dict[str, Any]) -> ActionResult:
    """The SDK's result from an action view (its ``result`` plus the action's id and kind)."""
    return result_from_dict({**view["result"], "action_id": view["action_id"], "kind": view["kind"]})
