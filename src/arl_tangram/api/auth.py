"""Shell: who is calling: a bearer token maps to a tenant (the only source of ``spec.tenant``).

With no tokens configured the server (bound to loopback by default) serves every call as
tenant ``default``; once tokens are configured every call needs a known one, else 401.
Tokens come from the configuration's ``[tenants.<name>] token`` / ``token_env`` when the
runtime's configuration has tenants, and from ``create_app(tokens=...)`` (tests, embedding).
Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request

from arl_tangram.api.state import DEFAULT_TENANT, ApiState, check_tenant_name

BEARER_SCHEME = {"type": "http", "scheme": "bearer", "description": "an API token; required once tokens are configured"}


def document_bearer(app: FastAPI, extra_schemas: Mapping[str, Any] | None = None) -> None:
    """Declare the bearer scheme in the app's OpenAPI schema (optional: a server without
    tokens takes calls without one), and ``extra_schemas`` (name -> JSON schema with
    ``$defs``) that routes reading their own input refer to."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = original()
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {})["bearer"] = BEARER_SCHEME
            schemas = components.setdefault("schemas", {})
            for name, extra in (extra_schemas or {}).items():
                extra = dict(extra)
                schemas.update(extra.pop("$defs", {}))
                schemas[name] = extra
            schema["security"] = [{"bearer": []}, {}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def tokens_from_config(config: Any) -> dict[str, str]:
    """token -> tenant from ``config.tenants`` (the runtime's ``TenantConfig`` s) when it has them."""
    tenants: Mapping[str, Any] = getattr(config, "tenants", None) or {}
    tokens: dict[str, str] = {}
    for name, tenant in sorted(tenants.items()):
        token = getattr(tenant, "token", None)
        if token:
            tokens[token] = check_tenant_name(name, f"tenants.{name}")
    return tokens


# Dependencies are coroutines on purpose: FastAPI runs a plain function one in a worker
# thread, which costs more than the whole of a no-resource action.
async def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


async def tenant_of(request: Request) -> str:
    """The caller's tenant; 401 when tokens are configured and the call has no known one.
    (The header is read here rather than through ``HTTPBearer``: one dependency less on
    every request; ``document_bearer`` puts the scheme in the OpenAPI schema.)"""
    tokens = (await api_state(request)).tokens
    if not tokens:
        return DEFAULT_TENANT
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    found = None
    for token, tenant in tokens.items():  # every token compared: the time says nothing
        if hmac.compare_digest(token.encode(), given.encode()):
            found = tenant
    if found is None:
        detail = "a valid bearer token is required" if given else "an Authorization: Bearer <token> header is required"
        raise HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})
    return found


Tenant = Annotated[str, Depends(tenant_of)]
State = Annotated[ApiState, Depends(api_state)]
