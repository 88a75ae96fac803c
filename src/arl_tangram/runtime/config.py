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
    handler = "score"                 # embed | score | logprobs
    devices_min = 1
    devices_max = 1
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from arl_tangram.core.errors import SpecError
from arl_tangram.core.policies.base import Policy
from arl_tangram.core.policies.registry import POLICIES, make_policy
from arl_tangram.core.topology import QuotaPoolSpec
from arl_tangram.managers.api.config import ProviderConfig

#: request handlers of model services (managers/gpu/handlers.py ``HANDLERS``; named here so
#: reading a configuration never imports torch)
SERVICE_HANDLERS = ("embed", "score", "logprobs")
DEVICE_COUNTS = (1, 2, 4, 8)  # the core's aligned GPU chunk sizes
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


class ConfigError(SpecError):
    """A configuration value broke a rule; ``field`` is its path (``providers[1].rps``)."""


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "elastic"
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def make_policy(self) -> Policy:
        """A fresh policy instance of the configured name and parameters."""
        return make_policy(self.policy, **self.params)


@dataclass(frozen=True)
class CpuConfig:
    """Sandbox defaults: ``pool_size`` warm sandboxes; limits of one sandbox."""

    pool_size: int = 0
    mem_bytes: int = 1 << 30
    pids_max: int = 512
    workspace_bytes: int = 512 << 20
    tmp_bytes: int = 256 << 20


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


@dataclass(frozen=True)
class TangramConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cpu: CpuConfig = field(default_factory=CpuConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    providers: tuple[ProviderConfig, ...] = ()
    services: tuple[ServiceConfig, ...] = ()
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
    data = _parse_yaml(text) if yaml else _parse_toml(text)
    root = _Table(data, "")
    config = TangramConfig(
        scheduler=_scheduler(root.table("scheduler")),
        cpu=_cpu(root.table("cpu")),
        gpu=_gpu(root.table("gpu")),
        providers=_unique(tuple(_provider(t, os.environ if environ is None else environ) for t in root.tables("providers")), "providers"),
        services=_unique(tuple(_service(t) for t in root.tables("services")), "services"),
        source=source,
    )
    root.done()
    return config


def quota_pools(config: TangramConfig) -> tuple[QuotaPoolSpec, ...]:
    """One core quota pool per provider: its keys' limits summed (concurrency and rate)."""
    return tuple(
        QuotaPoolSpec(p.name, max_concurrency=p.max_concurrency * p.num_keys, rate_per_s=p.rate_per_s * p.num_keys)
        for p in config.providers
    )


def parse_size_bytes(value: object, where: str) -> int:
    """Bytes from an integer or a size string (``"512MiB"``, ``"2GiB"``, ``"1GB"``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])
    else:
        raise ConfigError(where, 'must be a byte count or a size such as "512MiB" or "2GiB"', value)
    if size <= 0:
        raise ConfigError(where, "must be > 0 bytes", value)
    return size


class _Table:
    """One mapping of the file; every key read is checked off, ``done`` rejects the rest."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(where or "<file>", "must be a table (mapping)", type(data).__name__)
        self.data, self.where, self.seen = data, where, set[str]()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def table(self, key: str) -> _Table:
        return _Table(self.get(key, {}), self.path(key))

    def tables(self, key: str) -> list[_Table]:
        items = self.get(key, [])
        if not isinstance(items, list):
            raise ConfigError(self.path(key), "must be an array of tables ([[...]])", type(items).__name__)
        return [_Table(item, f"{self.path(key)}[{i}]") for i, item in enumerate(items)]

    def done(self) -> None:
        for key in sorted(set(self.data) - self.seen, key=str):
            known = ", ".join(sorted(self.seen)) or "none"
            # a misspelt "keys" must not print the secrets it holds
            value = "<hidden>" if "key" in str(key).lower() else self.data[key]
            raise ConfigError(self.path(str(key)), f"is not a known key (known: {known})", value)

    def integer(self, key: str, default: int, minimum: int) -> int:
        value = self.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(self.path(key), f"must be an integer >= {minimum}", value)
        return value

    def number(self, key: str, default: float, check: Callable[[float], bool], rule: str) -> float:
        value = self.get(key, default)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or not check(value):
            raise ConfigError(self.path(key), f"must be a finite number {rule}", value)
        return float(value)

    def string(self, key: str, default: str | None, rule: str = "must be a non-empty string") -> str:
        value = self.get(key, default)
        if not isinstance(value, str) or not value:
            raise ConfigError(self.path(key), rule, value)
        return value

    def size(self, key: str, default: int, minimum: int) -> int:
        size = parse_size_bytes(self.get(key, default), self.path(key))
        if size < minimum:
            raise ConfigError(self.path(key), f"must be >= {minimum} bytes", size)
        return size


def _scheduler(t: _Table) -> SchedulerConfig:
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


def _cpu(t: _Table) -> CpuConfig:
    config = CpuConfig(
        pool_size=t.integer("pool_size", 0, minimum=0),
        mem_bytes=t.size("mem_bytes", CpuConfig.mem_bytes, minimum=16 << 20),
        pids_max=t.integer("pids_max", CpuConfig.pids_max, minimum=8),
        workspace_bytes=t.size("workspace_bytes", CpuConfig.workspace_bytes, minimum=1 << 20),
        tmp_bytes=t.size("tmp_bytes", CpuConfig.tmp_bytes, minimum=1 << 20),
    )
    t.done()
    return config


def _gpu(t: _Table) -> GpuConfig:
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


def _keys(t: _Table, environ: Mapping[str, str]) -> tuple[str, ...]:
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


def _provider(t: _Table, environ: Mapping[str, str]) -> ProviderConfig:
    name = t.string("name", None)
    if not _NAME.match(name):
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


def _service(t: _Table) -> ServiceConfig:
    name = t.string("name", None)
    if not _NAME.match(name):
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
    t.done()
    return ServiceConfig(name, handler, folder, module, devices["devices_min"], devices["devices_max"], weight_bytes)


def _unique(items: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item.name in seen:
            raise ConfigError(f"{where}[{i}].name", "must be unique", item.name)
        seen.add(item.name)
    return items


def _parse_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("<file>", f"must be valid TOML: {exc}", None) from None


def _parse_yaml(text: str) -> Any:
    try:
        import yaml  # optional: TOML needs nothing beyond the standard library
    except ImportError:
        raise ConfigError("<file>", "YAML needs PyYAML installed (pip install pyyaml); TOML needs nothing", None) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("<file>", f"must be valid YAML: {exc}", None) from None
    return {} if data is None else data
