"""Shell: the FastAPI app factory of the native ``/v1`` API (OpenAPI at ``/openapi.json``).

``create_app(config_or_runtime)``: given a ``TangramConfig`` (or ``None``: the embedded
defaults) the app starts its own ``EmbeddedRuntime`` when the server starts and closes it
(every sandbox destroyed, every unfinished action ended) when the server stops; given a
running ``EmbeddedRuntime`` it serves that one and leaves closing it to its owner. Either
way the runtime must live on the server's event loop, which is the controller's.
Settings: arguments win, then the configuration's ``[service]`` / ``[tenants]`` tables
(when the runtime's configuration has them), then the defaults in ``state``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import FastAPI

from arl_tangram import __version__
from arl_tangram.api import (
    errors,
    routes_actions,
    routes_envs,
    routes_images,
    routes_services,
    routes_snapshots,
    routes_system,
)
from arl_tangram.api.auth import document_bearer, tokens_from_config
from arl_tangram.api.edge import BodyLimits, BodyMeter, Edge
from arl_tangram.api.json_body import JsonWorkers
from arl_tangram.api.schemas import CROSS_FIELD_RULES
from arl_tangram.api.state import (
    DEFAULT_CREATE_TIMEOUT_S,
    DEFAULT_MAX_QUEUED_ACTIONS,
    ApiState,
    check_tenant_name,
)
from arl_tangram.runtime.config import ConfigError, TangramConfig
from arl_tangram.runtime.embedded import EmbeddedRuntime
from arl_tangram.runtime.loop import Round


def create_app(
    config_or_runtime: TangramConfig | EmbeddedRuntime | None = None,
    *,
    tokens: Mapping[str, str] | None = None,
    max_queued_actions: int | None = None,
    create_timeout_s: float | None = None,
    body_limits: BodyLimits | None = None,
) -> FastAPI:
    """The app. ``tokens`` maps bearer token -> tenant, added to the configured ones; with
    none at all every call is tenant ``default``. ``max_queued_actions`` bounds the actions
    submitted and not yet ended (beyond it: 503 with ``Retry-After``). ``body_limits``
    (else the configuration's ``[service] max_*_bytes``) caps request bodies (413).
    ``app.state.body_meter`` counts the body bytes the app read (``api.edge``)."""
    settings = dict(
        tokens=dict(tokens or {}), max_queued_actions=max_queued_actions,
        create_timeout_s=create_timeout_s, body_limits=body_limits,
    )  # fmt: skip
    for token, tenant in settings["tokens"].items():  # type: ignore[union-attr]
        check_tenant_name(tenant, "tokens")
        if not token:
            raise ConfigError("tokens", "must not contain an empty token", tenant)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # a runtime (embedded, or the Ray one with the same face) is served as given
        owned = config_or_runtime is None or isinstance(config_or_runtime, TangramConfig)
        runtime: EmbeddedRuntime = (
            await EmbeddedRuntime.start(config_or_runtime) if owned else config_or_runtime  # type: ignore[arg-type,assignment]
        )
        try:
            state = _make_state(runtime, settings)
        except BaseException:  # a bad setting: the runtime started for it is closed again
            if owned:
                await runtime.aclose()
            raise
        app.state.api = state
        if owned:  # the stop's first moment ends what is pending (runtime.shutdown says why)
            state.stopping.add_done_callback(lambda _f: runtime.controller.begin_shutdown())
        app.state.json_workers = JsonWorkers()
        restore = _watch_rounds(state)
        try:
            yield
        finally:
            state.begin_stopping()
            restore()
            if owned:
                await runtime.aclose()
            await state.drain()
            await app.state.json_workers.aclose()

    app = FastAPI(
        title="ARL-Tangram", version=__version__, lifespan=lifespan,
        description="Per-action management of the external resources of agentic RL: sandboxes, model services, API quotas.",
        # FastAPI's OpenTelemetry bridge asks the OTel providers on every request (about
        # 0.4 ms, as much as the rest of a no-resource action); metrics are Prometheus here.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )  # fmt: skip
    errors.install(app)
    app.state.body_meter = BodyMeter()
    app.add_middleware(Edge, meter=app.state.body_meter)
    action_schema = routes_actions.ACTION_ADAPTER.json_schema(ref_template="#/components/schemas/{model}")
    document_bearer(app, {"ActionCreate": action_schema})
    _document_cross_field_rules(app)
    for module in (routes_envs, routes_snapshots, routes_actions, routes_images, routes_services, routes_system):
        app.include_router(module.router)
    return app


def _document_cross_field_rules(app: FastAPI) -> None:
    """``info.x-cross-field-rules``: the rules between fields JSON Schema cannot state."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        schema = original()
        schema["info"].setdefault("x-cross-field-rules", list(CROSS_FIELD_RULES))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _setting(explicit: Any, config: TangramConfig, name: str, default: Any) -> Any:
    if explicit is not None:
        return explicit
    value = getattr(config.service, name, None)
    return default if value is None else value


def _make_state(runtime: EmbeddedRuntime, settings: dict[str, Any]) -> ApiState:
    config = runtime.config
    tokens = {**tokens_from_config(config), **settings["tokens"]}
    max_queued = int(_setting(settings["max_queued_actions"], config, "max_queued_actions", DEFAULT_MAX_QUEUED_ACTIONS))
    if max_queued < 1:
        raise ConfigError("max_queued_actions", "must be an integer >= 1", max_queued)
    state = ApiState(
        runtime, tokens=tokens, max_queued_actions=max_queued, shared_services=frozenset(s.name for s in config.services),
    )  # fmt: skip
    state.create_timeout_s = float(settings["create_timeout_s"] or DEFAULT_CREATE_TIMEOUT_S)
    metrics_token = getattr(config.service, "metrics_token", None)
    if metrics_token is not None and metrics_token in tokens:
        raise ConfigError("service.metrics_token", "must differ from every tenant's token", "<hidden>")
    state.metrics.operator_token = metrics_token
    state.body_limits = settings["body_limits"] or BodyLimits(
        _setting(None, config, "max_body_bytes", BodyLimits.body_bytes),
        _setting(None, config, "max_file_body_bytes", BodyLimits.file_bytes),
        _setting(None, config, "max_upload_bytes", BodyLimits.upload_bytes),
    )
    state.on_done.append(state.metrics.observe)
    return state


def _watch_rounds(state: ApiState) -> Callable[[], None]:
    """Chain the metrics onto the controller loop's round log (its documented seam); the
    returned call puts the previous sink back."""
    loop = state.controller.loop
    previous = loop.log

    def log(round_: Round) -> None:
        if previous is not None:
            previous(round_)
        state.metrics.on_round(round_)

    loop.log = log

    def restore() -> None:
        loop.log = previous

    return restore
