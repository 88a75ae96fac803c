"""Shell: plain-dict (JSON-ready) forms of what the journal keeps: ``ActionSpec``, the live
payloads and ``ActionResult``. Kept out of the core, whose dataclasses stay pure.

Who calls: the journal (write at accept and end, read at restart); the HTTP API may use the
same forms. ``*_from_dict(*_to_dict(x)) == x`` for every spec, payload and result, except a
``Learned`` elasticity, which is per-kind learned state: it is written as ``learned`` and
read back as the learned model the caller passes (the restarted controller's, for its kind).
Unknown scalar fields of ``ActionSpec`` (added to the core later) travel as they are.
A result's held outputs (``runtime.actions.LazyOutput``, left on their node) are written as
their sizes only and read back as ``LostOutput`` s: the journal never fetches them (it
writes on the controller's loop) and a restarted service could not fetch them anyway.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.elasticity import Amdahl, ElasticityModel, Learned, NonElastic, Table
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import (
    ActionResult,
    ApiPayload,
    ExecPayload,
    LostOutput,
    NoopPayload,
    Payload,
    ServicePayload,
    SnapshotPayload,
)

_VECTOR_FIELDS = ("cpu_millicores", "mem_bytes", "gpu_devices", "quota_tokens")
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ActionSpec))
_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ActionResult))
_PLAIN = (str, int, float, bool, type(None))


def elasticity_to_dict(model: ElasticityModel) -> dict[str, Any]:
    if isinstance(model, NonElastic):
        return {"model": "non_elastic"}
    if isinstance(model, Amdahl):
        return {"model": "amdahl", "serial_fraction": model.serial_fraction}
    if isinstance(model, Table):
        return {"model": "table", "efficiencies": list(model.efficiencies)}
    if isinstance(model, Learned):
        return {"model": "learned"}
    raise TypeError(f"no dict form for elasticity model {type(model).__name__}")


def elasticity_from_dict(data: dict[str, Any], learned: Callable[[], Learned]) -> ElasticityModel:
    model = data.get("model")
    if model == "non_elastic":
        return NonElastic()
    if model == "amdahl":
        return Amdahl(float(data["serial_fraction"]))
    if model == "table":
        return Table(tuple(float(e) for e in data["efficiencies"]))
    if model == "learned":
        return learned()
    raise SpecError("elasticity.model", "must be one of non_elastic, amdahl, table, learned", model)


def spec_to_dict(spec: ActionSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _SPEC_FIELDS:
        value = getattr(spec, name)
        if isinstance(value, _PLAIN):
            pass
        elif isinstance(value, ResourceVector):
            value = {name: getattr(value, name) for name in _VECTOR_FIELDS}
        elif isinstance(value, Binding):
            value = {"kind": value.kind, "name": value.name}
        elif isinstance(value, ResourceKind):
            value = value.value
        elif isinstance(value, ElasticityModel):
            value = elasticity_to_dict(value)
        out[name] = value
    return out


def spec_from_dict(data: dict[str, Any], learned: Callable[[str], Learned]) -> ActionSpec:
    """The spec ``data`` describes; ``learned(kind)`` gives the model of a ``learned`` one.
    Raises ``SpecError`` (the core's validation) on a malformed dict."""
    args = {k: v for k, v in data.items() if k in _SPEC_FIELDS}
    for name in ("demand_fixed", "demand_per_unit"):
        if name in args:
            args[name] = ResourceVector(**{k: int(args[name].get(k, 0)) for k in _VECTOR_FIELDS})
    if "binding" in args:
        args["binding"] = Binding(args["binding"]["kind"], args["binding"]["name"])
    if args.get("key") is not None:
        args["key"] = ResourceKind.parse(args["key"])
    if "elasticity" in args:
        kind = str(args.get("kind", ""))
        args["elasticity"] = elasticity_from_dict(args["elasticity"], lambda: learned(kind))
    return ActionSpec(**args)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def payload_to_dict(payload: Payload) -> dict[str, Any]:
    """A service or API body is kept as it is: the caller's ``json.dumps`` finds one JSON cannot hold."""
    if isinstance(payload, ExecPayload):
        command = payload.command if isinstance(payload.command, str) else list(payload.command)
        return {
            "type": "exec", "command": command, "stdin": _b64(payload.stdin), "env": [list(kv) for kv in payload.env],
            "cwd": payload.cwd, "timeout_s": payload.timeout_s, "session_id": payload.session_id,
        }  # fmt: skip
    if isinstance(payload, ServicePayload):
        return {"type": "service", "request": payload.request}
    if isinstance(payload, ApiPayload):
        return {
            "type": "api", "method": payload.method, "path": payload.path, "json": payload.json,
            "params": [list(kv) for kv in payload.params], "tokens": payload.tokens, "timeout_s": payload.timeout_s,
        }  # fmt: skip
    if isinstance(payload, NoopPayload):
        return {"type": "noop"}
    if isinstance(payload, SnapshotPayload):
        return {"type": "snapshot", "snapshot_id": payload.snapshot_id, "name": payload.name}
    raise TypeError(f"no dict form for payload {type(payload).__name__}")


def payload_from_dict(data: dict[str, Any]) -> Payload:
    kind = data.get("type")
    if kind == "exec":
        command = data["command"] if isinstance(data["command"], str) else tuple(data["command"])
        stdin = None if data.get("stdin") is None else base64.b64decode(data["stdin"])
        return ExecPayload(
            command, stdin, tuple((k, v) for k, v in data.get("env", ())), data.get("cwd"),
            float(data.get("timeout_s", 60.0)), data.get("session_id"),
        )  # fmt: skip
    if kind == "service":
        return ServicePayload(data.get("request"))
    if kind == "api":
        return ApiPayload(
            data.get("method", "POST"), data.get("path", "/"), data.get("json"),
            tuple((k, v) for k, v in data.get("params", ())), data.get("tokens"), float(data.get("timeout_s", 60.0)),
        )  # fmt: skip
    if kind == "noop":
        return NoopPayload()
    if kind == "snapshot":
        return SnapshotPayload(str(data["snapshot_id"]), str(data.get("name", "")))
    raise SpecError("payload.type", "must be one of exec, service, api, noop, snapshot", kind)


def result_to_dict(result: ActionResult) -> dict[str, Any]:
    """A service's output that JSON cannot hold (an array) is kept as its ``tolist()``, else its repr."""
    out = {
        name: getattr(result, name) for name in _RESULT_FIELDS
    }  # all plain but ``output``, ``held``
    if not isinstance(result.output, _PLAIN):
        out["output"] = json.loads(json.dumps(result.output, default=_jsonable))
    out["held"] = {name: lazy.size_bytes for name, lazy in sorted(result.held.items())}
    return out


def result_from_dict(data: dict[str, Any]) -> ActionResult:
    args = {k: v for k, v in data.items() if k in _RESULT_FIELDS}
    why = "it was held on its node and the service restarted since"
    args["held"] = {
        name: LostOutput(int(size), why) for name, size in (args.get("held") or {}).items()
    }
    return ActionResult(**args)


def _jsonable(value: object) -> object:
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else repr(value)
