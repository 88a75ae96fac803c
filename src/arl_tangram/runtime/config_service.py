"""Shell: the service's sections of the configuration file: ``[service]`` (journal, env
leases, result retention, the admission bound, what tenants may register, the metrics
token, the shutdown grace, request body caps) and ``[tenants.<name>]`` (API tokens, fair
share weights, per-tenant limits). ``config`` documents the whole file.

Who calls: ``config.parse_config``; the runtime reads the frozen results.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from arl_tangram.runtime.config_reader import NAME, ConfigError, Table, parse_size_bytes

MODULE_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
MAX_SHUTDOWN_GRACE_S = 600.0


@dataclass(frozen=True)
class ServiceSettings:
    """The long-running service: durability (``journal_path``, None = no journal), env
    leases, result retention and the admission bound of the whole service.

    Operator powers: ``allowed_modules`` (exact ``"pkg.mod:factory"`` strings) and
    ``allowed_folders`` (absolute model folders; a folder inside one counts) are all a
    tenant may register over HTTP (empty: nothing); ``metrics_token`` (None: none) reads
    every tenant's ``/metrics`` series. ``shutdown_grace_s`` bounds a stop (SIGTERM) from
    its first moment to the process's exit."""

    journal_path: str | None = None
    env_idle_ttl_s: float = 600.0
    result_retention_s: float = 3600.0
    max_queued_actions: int = 10000
    request_id_ttl_s: float = 86400.0
    allowed_modules: tuple[str, ...] = ()
    allowed_folders: tuple[str, ...] = ()
    metrics_token: str | None = field(default=None, repr=False)
    shutdown_grace_s: float = 10.0
    # request bodies (api.edge): JSON routes, file PUTs, SWE-ReX uploads; past them: 413
    max_body_bytes: int = 16 << 20
    max_file_body_bytes: int = 64 << 20
    max_upload_bytes: int = 256 << 20


@dataclass(frozen=True)
class TenantConfig:
    """One tenant (an RL job): its API token (None: reachable only without a token, as the
    local default tenant is), its fair-share ``weight`` and its limits (None = unlimited)."""

    name: str
    token: str | None = field(default=None, repr=False)
    weight: float = 1.0
    max_envs: int | None = None
    max_concurrent_actions: int | None = None
    max_mem_bytes: int | None = None


def read_service_settings(t: Table, environ: Mapping[str, str] | None = None) -> ServiceSettings:
    environ = os.environ if environ is None else environ
    journal_path = t.get("journal_path")
    if journal_path is not None:
        journal_path = t.string("journal_path", None, "must be a non-empty path")
    positive = (lambda v: v > 0, "> 0")
    config = ServiceSettings(
        journal_path=journal_path,
        env_idle_ttl_s=t.number("env_idle_ttl_s", ServiceSettings.env_idle_ttl_s, *positive),
        result_retention_s=t.number(
            "result_retention_s", ServiceSettings.result_retention_s, *positive
        ),
        max_queued_actions=t.integer(
            "max_queued_actions", ServiceSettings.max_queued_actions, minimum=1
        ),
        request_id_ttl_s=t.number("request_id_ttl_s", ServiceSettings.request_id_ttl_s, *positive),
        allowed_modules=_strings(t, "allowed_modules", MODULE_FACTORY.match, 'must list "package.module:factory" strings'),
        allowed_folders=_strings(t, "allowed_folders", os.path.isabs, "must list absolute folder paths"),
        metrics_token=_metrics_token(t, environ),
        shutdown_grace_s=t.number(
            "shutdown_grace_s", ServiceSettings.shutdown_grace_s, lambda v: 0 < v <= MAX_SHUTDOWN_GRACE_S,
            f"in (0, {MAX_SHUTDOWN_GRACE_S:g}]",
        ),
        max_body_bytes=t.size("max_body_bytes", ServiceSettings.max_body_bytes, minimum=1024),
        max_file_body_bytes=t.size("max_file_body_bytes", ServiceSettings.max_file_body_bytes, minimum=1024),
        max_upload_bytes=t.size("max_upload_bytes", ServiceSettings.max_upload_bytes, minimum=1024),
    )
    t.done()
    return config


def _strings(t: Table, key: str, check: Callable[[str], object], rule: str) -> tuple[str, ...]:
    """A list of non-empty strings that each pass ``check`` (a predicate)."""
    value = t.get(key, [])
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(isinstance(v, str) and v and check(v) for v in value):
        raise ConfigError(t.path(key), rule, value)
    return tuple(value)


def _metrics_token(t: Table, environ: Mapping[str, str]) -> str | None:
    """The operator's ``/metrics`` token: ``metrics_token`` or ``metrics_token_env``."""
    token, var = t.get("metrics_token"), t.get("metrics_token_env")
    if token is not None and var is not None:
        raise ConfigError(t.path("metrics_token"), "at most one of metrics_token or metrics_token_env may be set", "<hidden>")
    if var is not None:
        name = t.string("metrics_token_env", None, "must name an environment variable")
        token = environ.get(name, "")
        if not token.strip():
            raise ConfigError(t.path("metrics_token_env"), "must name an environment variable that is set and non-empty", name)
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigError(t.path("metrics_token"), "must be a non-empty string", "<hidden>")
    return None if token is None else token.strip()


def read_tenants(t: Table, environ: Mapping[str, str]) -> Mapping[str, TenantConfig]:
    tenants: dict[str, TenantConfig] = {}
    owner_of_token: dict[str, str] = {}
    for name in sorted(t.data, key=str):
        sub = t.table(str(name))
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(
                sub.where, "a tenant name must be letters, digits, '_', '-', '.', '/'", name
            )
        tenant = _tenant(name, sub, environ)
        if tenant.token is not None:
            if tenant.token in owner_of_token:
                where = sub.path("token_env" if "token_env" in sub.data else "token")
                raise ConfigError(
                    where,
                    f"must be unique across tenants (tenant {owner_of_token[tenant.token]!r} has it)",
                    "<hidden>",
                )
            owner_of_token[tenant.token] = name
        tenants[name] = tenant
    t.done()
    return MappingProxyType(tenants)


def _tenant(name: str, t: Table, environ: Mapping[str, str]) -> TenantConfig:
    t.secret = True
    token, token_env = t.get("token"), t.get("token_env")
    if token is not None and token_env is not None:
        raise ConfigError(
            t.path("token"), "at most one of token or token_env may be set", "<hidden>"
        )
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigError(t.path("token"), "must be a non-empty string", "<hidden>")
    if token_env is not None:
        var = t.string("token_env", None, "must name an environment variable")
        if not environ.get(var, "").strip():
            raise ConfigError(
                t.path("token_env"),
                "must name an environment variable that is set and non-empty",
                var,
            )
        token = environ[var]
    limits: dict[str, int | None] = {}
    for key in ("max_envs", "max_concurrent_actions"):
        limits[key] = None if t.get(key) is None else t.integer(key, 0, minimum=1)
    mem = t.get("max_mem_bytes")
    config = TenantConfig(
        name=name,
        token=None if token is None else token.strip(),
        weight=t.number("weight", 1.0, lambda v: v > 0, "> 0"),
        max_envs=limits["max_envs"],
        max_concurrent_actions=limits["max_concurrent_actions"],
        max_mem_bytes=None if mem is None else parse_size_bytes(mem, t.path("max_mem_bytes")),
    )
    t.done()
    return config


def check_metrics_token(service: ServiceSettings, tenants: Mapping[str, TenantConfig]) -> None:
    """The operator's metrics token reads every tenant's series: no tenant may hold it."""
    if service.metrics_token is not None and any(t.token == service.metrics_token for t in tenants.values()):
        raise ConfigError("service.metrics_token", "must differ from every tenant's token", "<hidden>")
