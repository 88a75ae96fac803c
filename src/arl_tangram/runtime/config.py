"""Shell: the one configuration file of ARL-Tangram (TOML; YAML too when PyYAML is
installed), read into frozen dataclasses and validated with errors that name the field path
and the rule (``providers[1].rps: must be a finite number > 0``). Unknown keys are errors.

Who calls: the embedded SDK / controller at start (``load_config(path)``; ``None`` gives the
embedded defaults: policy ``elastic``, GPU devices ``auto``, no providers, no services), and
``quota_pools(config)`` to give the core one quota pool per provider. Example::

    [scheduler]
    policy = "elastic"                # elastic | k8s-static | task-pool | fixed-dop | ideal
    params = { depth = 32, aging_s = 10.0 }

    [cpu]
    pool_size = 4                     # warm sandboxes
    mem_bytes = "2GiB"                # sizes: bytes, or "512MiB", "2GiB", "1GB", ...
    pids_max = 512
    workspace_bytes = "512MiB"
    tmp_bytes = "256MiB"
    kill_grace_s = 2.0                # a timed-out or cancelled action's processes are gone within this

    [gpu]
    devices = "auto"                  # "auto": CUDA if torch sees it, else CPU devices; or a count of CPU devices
    device_mem_bytes = "4GiB"         # per CPU device (and per CUDA device when set)
    mem_fraction = 0.8                # of each CUDA device's free memory when device_mem_bytes is unset

    [[providers]]
    name = "search"
    base_url = "https://api.example.com"
    keys_env = "SEARCH_API_KEYS"      # or keys = ["sk-...", ...]; comma- or space-separated in the variable
    rps = 5                           # per key
    tokens_per_min = 100000           # per key; omit for unlimited
    max_concurrency = 8               # per key
    auth_header = "Authorization"     # sent as "<auth_header>: <auth_scheme> <key>"
    auth_scheme = "Bearer"

    [[services]]
    name = "reward/minilm"
    folder = "/models/all-MiniLM-L6-v2"   # or module = "package.module:factory"
    handler = "score"                 # embed | score | logprobs | classify | generate
    devices_min = 1
    devices_max = 1
    # generate only: the KV cache a replica reserves beside its weights = max_batch x
    # max_context_tokens x the model's KV bytes per token
    max_batch = 16                    # sequences one replica decodes together
    max_context_tokens = 2048         # prompt + new tokens of one sequence (omit: the model's context)

    [service]
    journal_path = "/var/lib/arl-tangram/journal.sqlite"   # omit: no journal (the embedded default)
    env_idle_ttl_s = 600              # an env unused (no action, file or session call, no renew) this long is released
    result_retention_s = 3600         # an unacknowledged result is forgotten this long after it ended
    max_queued_actions = 10000        # unfinished actions of all tenants; beyond it: overloaded (429/503)
    request_id_ttl_s = 86400          # with a journal: how long a request id stays idempotent
    allowed_modules = ["my_models.judge:build"]   # what a tenant may register over HTTP (exact factories) ...
    allowed_folders = ["/models"]     # ... and model folders (these, or folders inside them); omit: nothing
    metrics_token_env = "METRICS_TOKEN"   # or metrics_token = "..."; reads every tenant's /metrics series
    shutdown_grace_s = 10             # SIGTERM to exit, at most (pending creations and queued actions end at once)

    [images]                          # the node's image store (runtime/config_images.py); omit: host root only
    store_path = "/var/lib/arl-tangram/images"
    max_store_bytes = "200GiB"
    max_concurrent_pulls = 4
    registries = [{ host = "127.0.0.1:5000", insecure = true }]   # username, password_env for basic auth

    [e2b]                             # the E2B-compatible face (runtime/config_e2b.py); omit: its defaults
    templates = { base = "host", python = "127.0.0.1:5000/library/python:3.12" }

    [sandboxfusion]                   # the SandboxFusion face (runtime/config_sandboxfusion.py)
    language_images = { go = "sf-langs:1", rust = "sf-langs:1" }   # language -> image its runs use

    [tenants.team-a]
    token_env = "TEAM_A_TOKEN"        # or token = "..."; unique across tenants; omit: reachable without a token only
    weight = 2.0                      # its weighted fair share of a contended pool (> 0)
    max_envs = 64                     # omit any limit: unlimited
    max_concurrent_actions = 512      # accepted and not yet ended
    max_mem_bytes = "128GiB"          # the sum of its envs' memory
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from arl_tangram.core.errors import SpecError
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.policies.registry import POLICIES, make_policy
from arl_tangram.core.topology import QuotaPoolSpec
from arl_tangram.managers.api.config import ProviderConfig
from arl_tangram.runtime.config_e2b import E2bConfig, read_e2b
from arl_tangram.runtime.config_images import ImagesConfig, read_images
from arl_tangram.runtime.config_reader import (
    NAME,
    ConfigError,
    Table,
    parse_size_bytes,
    parse_toml,
    parse_yaml,
)
from arl_tangram.runtime.config_sandboxfusion import SandboxFusionConfig, read_sandboxfusion
from arl_tangram.runtime.config_service import (
    ServiceSettings,
    TenantConfig,
    check_metrics_token,
    read_service_settings,
    read_tenants,
)

__all__ = [
    "ConfigError", "CpuConfig", "GpuConfig", "SchedulerConfig", "ServiceConfig", "ServiceSettings", "TangramConfig",
    "TenantConfig", "load_config", "parse_config", "parse_size_bytes", "quota_pools",
]  # fmt: skip
#: request handlers of model services (managers/gpu/handlers.py ``HANDLERS``; named here so
#: reading a configuration never imports torch)
SERVICE_HANDLERS = ("embed", "score", "logprobs", "classify", "generate")
DEVICE_COUNTS = (1, 2, 4, 8)  # the core's aligned GPU chunk sizes


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "elastic"
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def make_policy(self) -> Policy:
        """A fresh policy instance of the configured name and parameters."""
        return make_policy(self.policy, **self.params)


@dataclass(frozen=True)
class CpuConfig:
    """Sandbox defaults: ``pool_size`` warm sandboxes; limits of one sandbox; the kill grace."""

    pool_size: int = 0
    mem_bytes: int = 1 << 30
    pids_max: int = 512
    workspace_bytes: int = 512 << 20
    tmp_bytes: int = 256 << 20
    kill_grace_s: float = 2.0
    # the memory this node's sandboxes may hold in all; None: a share of the host's memory
    # (``agent.node.DEFAULT_SANDBOX_MEMORY_SHARE``). A bench sets it to run on one budget.
    node_mem_bytes: int | None = None


@dataclass(frozen=True)
class GpuConfig:
    """``devices``: ``"auto"`` (CUDA devices if torch sees them, else one CPU device) or a
    count of CPU devices, each with an arena of ``device_mem_bytes``."""

    devices: str | int = "auto"
    device_mem_bytes: int = 2 << 30
    mem_fraction: float = 0.8


@dataclass(frozen=True)
class ServiceConfig:
    """A model service: weights from ``folder`` or built by ``module`` (``pkg.mod:factory``)."""

    name: str
    handler: str
    folder: str | None = None
    module: str | None = None
    devices_min: int = 1
    devices_max: int = 1
    weight_bytes: int | None = None
    max_batch: int | None = None  # generate: sequences decoded together (None: 16)
    max_context_tokens: int | None = None  # generate: None = the model's context


@dataclass(frozen=True)
class TangramConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    providers: tuple[ProviderConfig, ...] = ()
    services: tuple[ServiceConfig, ...] = ()
    service: ServiceSettings = field(default_factory=ServiceSettings)
    tenants: Mapping[str, TenantConfig] = field(default_factory=lambda: MappingProxyType({}))
    images: ImagesConfig | None = None  # None: no image store, only the host root runs
    e2b: E2bConfig = field(default_factory=E2bConfig)  # the E2B-compatible face (runtime/config_e2b.py)
    sandboxfusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)  # per-language images
    source: str | None = None  # the file it came from; None: embedded defaults


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> TangramConfig:
    """Read and validate the configuration file at ``path`` (``.yaml``/``.yml``: YAML, else
    TOML); ``None``: the embedded defaults. ``environ`` (default ``os.environ``) resolves
    ``keys_env``. Raises ``ConfigError`` naming the field and the rule."""
    if path is None:
        return TangramConfig()
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("path", f"must be a readable file ({exc.strerror})", str(file)) from None
    return parse_config(text, yaml=file.suffix.lower() in (".yaml", ".yml"), source=str(file), environ=environ)


def parse_config(
    text: str, *, yaml: bool = False, source: str | None = None, environ: Mapping[str, str] | None = None
) -> TangramConfig:
    """``load_config`` on a string (tests, the CLI's ``--config -``)."""
    data = parse_yaml(text) if yaml else parse_toml(text)
    root = Table(data, "")
    config = TangramConfig(
        scheduler=_scheduler(root.table("scheduler")),
        cpu=_cpu(root.table("cpu")),
        gpu=_gpu(root.table("gpu")),
        providers=_unique(tuple(_provider(t, os.environ if environ is None else environ) for t in root.tables("providers")), "providers"),
        services=_unique(tuple(_service(t) for t in root.tables("services")), "services"),
        service=read_service_settings(root.table("service"), os.environ if environ is None else environ),
        tenants=read_tenants(root.table("tenants"), os.environ if environ is None else environ),
        images=read_images(root.table("images")),
        e2b=read_e2b(root.table("e2b")),
        sandboxfusion=read_sandboxfusion(root.table("sandboxfusion")),
        source=source,
    )
    root.done()
    check_metrics_token(config.service, config.tenants)
    return config


def quota_pools(config: TangramConfig) -> tuple[QuotaPoolSpec, ...]:
    """One core quota pool per provider: its keys' limits summed (concurrency and rate)."""
    return tuple(
        QuotaPoolSpec(p.name, max_concurrency=p.max_concurrency * p.num_keys, rate_per_s=p.rate_per_s * p.num_keys)
        for p in config.providers
    )

def _scheduler(t: Table) -> SchedulerConfig:
    policy = t.string("policy", "elastic")
    if policy not in POLICIES:
        raise ConfigError(t.path("policy"), f"must be one of {', '.join(sorted(POLICIES))}", policy)
    params = t.table("params").data
    try:
        make_policy(policy, **params)  # constructors are pure: unknown parameters fail here
    except TypeError as exc:
        raise ConfigError(t.path("params"), f"must be parameters of policy {policy!r}: {exc}", dict(params)) from None
    t.done()
    return SchedulerConfig(policy, MappingProxyType(dict(params)))


def _cpu(t: Table) -> CpuConfig:
    config = CpuConfig(
        pool_size=t.integer("pool_size", 0, minimum=0),
        mem_bytes=t.size("mem_bytes", CpuConfig.mem_bytes, minimum=16 << 20),
        pids_max=t.integer("pids_max", CpuConfig.pids_max, minimum=8),
        workspace_bytes=t.size("workspace_bytes", CpuConfig.workspace_bytes, minimum=1 << 20),
        tmp_bytes=t.size("tmp_bytes", CpuConfig.tmp_bytes, minimum=1 << 20),
        kill_grace_s=t.number("kill_grace_s", CpuConfig.kill_grace_s, lambda v: 0 < v <= 60, "in (0, 60]"),
        node_mem_bytes=None if t.get("node_mem_bytes") is None else t.size("node_mem_bytes", 0, minimum=16 << 20),
    )
    t.done()
    return config


def _gpu(t: Table) -> GpuConfig:
    devices = t.get("devices", "auto")
    if devices != "auto" and (not isinstance(devices, int) or isinstance(devices, bool) or devices not in DEVICE_COUNTS):
        raise ConfigError(t.path("devices"), 'must be "auto" or a count of CPU devices in {1, 2, 4, 8}', devices)
    config = GpuConfig(
        devices=devices,
        device_mem_bytes=t.size("device_mem_bytes", GpuConfig.device_mem_bytes, minimum=1 << 20),
        mem_fraction=t.number("mem_fraction", GpuConfig.mem_fraction, lambda v: 0 < v <= 1, "in (0, 1]"),
    )
    t.done()
    return config


def _keys(t: Table, environ: Mapping[str, str]) -> tuple[str, ...]:
    keys, keys_env = t.get("keys"), t.get("keys_env")
    if (keys is None) == (keys_env is None):
        raise ConfigError(t.path("keys"), "exactly one of keys or keys_env must be set", "<hidden>")
    if keys_env is not None:
        name = t.string("keys_env", None, "must name an environment variable")
        if name not in environ:
            raise ConfigError(t.path("keys_env"), "must name an environment variable that is set", name)
        keys = environ[name].replace(",", " ").split()
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k.strip() for k in keys):
        where = t.path("keys" if keys_env is None else "keys_env")
        raise ConfigError(where, "must give a non-empty list of non-empty keys", "<hidden>")
    return tuple(k.strip() for k in keys)


def _provider(t: Table, environ: Mapping[str, str]) -> ProviderConfig:
    name = t.string("name", None)
    if not NAME.match(name):
        raise ConfigError(t.path("name"), "must be letters, digits, '_', '-', '.', '/'", name)
    base_url = t.string("base_url", None)
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(t.path("base_url"), "must start with http:// or https://", base_url)
    tokens_per_min = t.get("tokens_per_min")
    if tokens_per_min is not None:
        tokens_per_min = t.integer("tokens_per_min", 0, minimum=1)
    positive = (lambda v: v > 0, "> 0")
    config = dict(
        name=name,
        base_url=base_url,
        keys=_keys(t, environ),
        rate_per_s=t.number("rps", 10.0, *positive),
        tokens_per_min=tokens_per_min,
        max_concurrency=t.integer("max_concurrency", 8, minimum=1),
        burst=t.number("burst", 1.0, lambda v: v >= 1, ">= 1"),
        auth_header=t.string("auth_header", "Authorization"),
        auth_scheme=t.get("auth_scheme", "Bearer"),
        max_retries=t.integer("max_retries", 4, minimum=0),
        backoff_base_s=t.number("backoff_base_s", 0.5, *positive),
        backoff_cap_s=t.number("backoff_cap_s", 30.0, *positive),
        request_timeout_s=t.number("request_timeout_s", 60.0, *positive),
    )
    t.done()
    try:
        return ProviderConfig(**config)  # type: ignore[arg-type]
    except SpecError as exc:  # a rule only the manager knows: keep the file's field path
        leaf = exc.field.rsplit(".", 1)[-1]
        raise ConfigError(t.path("rps" if leaf == "rate_per_s" else leaf), exc.rule, exc.value) from None


def _service(t: Table) -> ServiceConfig:
    name = t.string("name", None)
    if not NAME.match(name):
        raise ConfigError(t.path("name"), "must be letters, digits, '_', '-', '.', '/'", name)
    folder, module = t.get("folder"), t.get("module")
    if (folder is None) == (module is None):
        raise ConfigError(t.path("folder"), "exactly one of folder or module must be set", folder or module)
    if folder is not None:
        t.string("folder", None, "must be a non-empty path")
    if module is not None and (not isinstance(module, str) or not re.match(r"^[\w.]+:\w+$", module)):
        raise ConfigError(t.path("module"), 'must be "package.module:factory"', module)
    handler = t.string("handler", None)
    if handler not in SERVICE_HANDLERS:
        raise ConfigError(t.path("handler"), f"must be one of {', '.join(SERVICE_HANDLERS)}", handler)
    devices = {}
    for key in ("devices_min", "devices_max"):
        devices[key] = t.get(key, 1)
        if devices[key] not in DEVICE_COUNTS or isinstance(devices[key], bool):
            raise ConfigError(t.path(key), "must be 1, 2, 4 or 8", devices[key])
    if devices["devices_min"] > devices["devices_max"]:
        raise ConfigError(t.path("devices_min"), "must be <= devices_max", devices["devices_min"])
    weight = t.get("weight_bytes")
    weight_bytes = None if weight is None else parse_size_bytes(weight, t.path("weight_bytes"))
    kv: dict[str, int | None] = {}
    for key, least in (("max_batch", 1), ("max_context_tokens", 2)):
        if t.get(key) is not None and handler != "generate":
            raise ConfigError(t.path(key), "applies to generate services only", t.get(key))
        kv[key] = None if t.get(key) is None else t.integer(key, 0, minimum=least)
    t.done()
    return ServiceConfig(
        name, handler, folder, module, devices["devices_min"], devices["devices_max"], weight_bytes,
        kv["max_batch"], kv["max_context_tokens"],
    )  # fmt: skip

def _unique(items: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item.name in seen:
            raise ConfigError(f"{where}[{i}].name", "must be unique", item.name)
        seen.add(item.name)
    return items
