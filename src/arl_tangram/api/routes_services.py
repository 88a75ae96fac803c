"""Shell: ``/v1/services`` (model services: register, list, status) and ``/v1/providers``.

Services the operator configured are shared by every tenant (one reward model serves every
job); a service a tenant registers is its own (internally ``~<tenant>/<name>``), listed and
callable by that tenant only, and only from what the operator allows (``registration``:
an allowlisted factory or model folder, else 403 with nothing imported). Registration
loads the model once (seconds), on a worker thread; the request waits for it. Providers
are the operator's configured API providers, shared by all.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

from fastapi import APIRouter

from arl_tangram.api.auth import State, Tenant
from arl_tangram.api.json_body import JsonBodyRoute
from arl_tangram.api.registration import allowed_folder, allowed_module
from arl_tangram.api.schemas import (
    ERROR_RESPONSES,
    ErrorBody,
    ProviderList,
    ProviderView,
    ServiceCreate,
    ServiceList,
    ServiceView,
)
from arl_tangram.api.state import ApiState, NotFound
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import ServiceConfig, ServiceSettings

router = APIRouter(prefix="/v1", tags=["services"], route_class=JsonBodyRoute)


def _gpu_services(state: ApiState) -> dict[str, Any]:
    gpu = state.runtime.agent.gpu
    return gpu.status()["services"] if gpu is not None else {}


def _service_view(state: ApiState, external: str, internal: str, shared: bool, gpu: dict[str, Any]) -> dict[str, Any]:
    spec = state.controller.loop.state.spec.services[internal]
    info = gpu.get(internal, {})
    return {
        "name": external, "shared": shared, "weight_bytes": spec.weight_bytes, "devices_min": spec.devices_min,
        "devices_max": spec.devices_max, "state": info.get("state", "registered"), "num_replicas": len(info.get("replicas", ())),
    }  # fmt: skip


def _check_source(body: ServiceCreate, settings: ServiceSettings) -> tuple[str | None, str | None]:
    """(folder, module) from the operator's allowlist; refuses what is not listed before
    anything is imported or read, and what cannot be a model before the GPU manager (and
    torch) is started for it. Worker thread: resolving paths and importing touch disk."""
    if (body.folder is None) == (body.module is None):
        raise SpecError("folder", "exactly one of folder or module must be set", body.folder or body.module)
    folder = None if body.folder is None else allowed_folder(body.folder, settings)
    module = None if body.module is None else allowed_module(body.module, settings)
    if folder is not None and not (Path(folder) / "config.json").is_file():
        raise SpecError("folder", "must be a model folder on the server (config.json and safetensors)", body.folder)
    if module is not None:
        module_name, _, attr = module.partition(":")
        try:
            found = importlib.util.find_spec(module_name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise SpecError("module", "must name an importable module on the server", body.module)
        if not callable(getattr(importlib.import_module(module_name), attr, None)):
            raise SpecError("module", "must name a callable factory in that module", body.module)
    if body.devices_min > body.devices_max:
        raise SpecError("devices_min", "must be <= devices_max", body.devices_min)
    for key in ("max_batch", "max_context_tokens"):
        if getattr(body, key) is not None and body.handler != "generate":
            raise SpecError(key, "applies to generate services only", getattr(body, key))
    return folder, module


@router.post("/services", response_model=ServiceView, status_code=201, responses={**ERROR_RESPONSES, 403: {"model": ErrorBody}})
async def register_service(state: State, tenant: Tenant, body: ServiceCreate) -> dict[str, Any]:
    """Register a model service private to the caller's tenant, from a factory or model
    folder the operator allows (else 403); returns once it is ready."""
    folder, module = await asyncio.to_thread(_check_source, body, state.runtime.config.service)
    internal = state.private_service(tenant, body.name)
    if internal in state.controller.loop.state.spec.services:
        raise SpecError("name", "must not name one of this tenant's registered services", body.name)
    config = ServiceConfig(
        internal, body.handler, folder, module, body.devices_min, body.devices_max,
        max_batch=body.max_batch, max_context_tokens=body.max_context_tokens,
    )  # fmt: skip
    # Its own task: a client that goes away does not abandon a half-made registration.
    await state.spawn(state.runtime.register_service(config))
    await _registered(state, internal)
    return _service_view(state, body.name, internal, False, _gpu_services(state))


async def _registered(state: ApiState, internal: str) -> None:
    """The registration is posted to the controller; wait (briefly) for its round to run."""
    for _ in range(200):
        if internal in state.controller.loop.state.spec.services:
            return
        await asyncio.sleep(0.005)


@router.get("/services", response_model=ServiceList, responses=ERROR_RESPONSES)
async def list_services(state: State, tenant: Tenant) -> dict[str, Any]:
    gpu = _gpu_services(state)
    return {"services": [_service_view(state, e, i, shared, gpu) for e, i, shared in state.services_of(tenant)]}


@router.get("/services/{name:path}", response_model=ServiceView, responses=ERROR_RESPONSES)
async def get_service(state: State, tenant: Tenant, name: str) -> dict[str, Any]:
    internal = state.service_internal(tenant, name)
    if internal is None:
        raise NotFound("name", name)
    return _service_view(state, name, internal, internal == name, _gpu_services(state))


def _providers(state: ApiState) -> dict[str, dict[str, Any]]:
    api = state.runtime.agent.api
    return api.status() if api is not None else {}


def _provider_view(name: str, s: dict[str, Any]) -> dict[str, Any]:
    keys = ("in_flight", "waiting", "upstream_429s", "waits", "tokens_used")
    return {"name": name, **{k: int(s.get(k, 0)) for k in keys}}


@router.get("/providers", response_model=ProviderList, responses=ERROR_RESPONSES)
async def list_providers(state: State, tenant: Tenant) -> dict[str, Any]:
    return {"providers": [_provider_view(n, s) for n, s in sorted(_providers(state).items())]}


@router.get("/providers/{name:path}", response_model=ProviderView, responses=ERROR_RESPONSES)
async def get_provider(state: State, tenant: Tenant, name: str) -> dict[str, Any]:
    providers = _providers(state)
    if name not in providers:
        raise NotFound("name", name)
    return _provider_view(name, providers[name])
