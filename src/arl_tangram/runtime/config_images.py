"""Shell: the ``[images]`` table of the configuration, the node's image store, and building
that store (``managers.images``, imported only when images are configured).

Example::

    [images]
    store_path = "/var/lib/arl-tangram/images"
    max_store_bytes = "200GiB"        # layers no image or sandbox uses are collected past it, LRU first
    max_concurrent_pulls = 4          # per node; the scheduler keeps to it too
    default_registry = "127.0.0.1:5000"   # bare names resolve here; omit: a bare name is an error
    allow_import_paths = false        # may HTTP clients import a path on the server? (operator only)
    max_snapshot_depth = 16           # snapshot layers stacked before the next snapshot is squashed
    max_fork_count = 64               # children one fork may make (more: 422 naming count)
    snapshot_ttl_s = 3600             # a snapshot nothing uses or pins is deleted after this
    aliases = {"docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest" = "127.0.0.1:5000/swe/django-11099:v1"}
                                      # reference a client names -> the reference (or id) used instead

    [[images.registries]]
    host = "127.0.0.1:5000"
    username = "ci"                   # omit both: anonymous (or bearer tokens the registry hands out)
    password_env = "REGISTRY_PASSWORD"    # read at start, never logged
    insecure = true                   # plain HTTP (a loopback registry)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from arl_tangram.core.env_spec import check_image_reference
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config_reader import ConfigError, Table


@dataclass(frozen=True)
class RegistryConfig:
    """Credentials of one registry: the password is named by ``password_env``, not held."""

    host: str
    username: str | None = None
    password_env: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class ImagesConfig:
    store_path: str
    max_store_bytes: int = 64 << 30
    max_layer_bytes: int = 16 << 30
    max_concurrent_pulls: int = 4
    default_registry: str | None = None
    allow_import_paths: bool = False
    registries: tuple[RegistryConfig, ...] = field(default_factory=tuple)
    max_snapshot_depth: int = 16
    max_fork_count: int = 64
    snapshot_ttl_s: float = 3600.0
    #: reference a client names -> the one used instead (see ``image_alias``)
    aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def image_alias(aliases: Mapping[str, str], image: str) -> str:
    """The image an env runs when a client names ``image``: its alias, else itself. One step,
    never chained, so an alias map cannot loop. Why: stock configs (mini-swe-agent's
    ``swebench.yaml``, E2B templates) name public registry images a node without internet
    cannot pull; the operator maps each to an image the store holds."""
    return aliases.get(image, image)


def read_images(t: Table) -> ImagesConfig | None:
    """The ``[images]`` table; None when absent (only the host root runs then)."""
    if not t.data:
        return None
    registries = tuple(_registry(r) for r in t.tables("registries"))
    default = t.get("default_registry")
    if default is not None and (not isinstance(default, str) or not default or "/" in default):
        raise ConfigError(t.path("default_registry"), "must be a registry host[:port]", default)
    allow = t.get("allow_import_paths", False)
    if not isinstance(allow, bool):
        raise ConfigError(t.path("allow_import_paths"), "must be a boolean", allow)
    config = ImagesConfig(
        aliases=_aliases(t.table("aliases")),
        store_path=t.string("store_path", None, "must name the store's directory"),
        max_store_bytes=t.size("max_store_bytes", ImagesConfig.max_store_bytes, minimum=1 << 20),
        max_layer_bytes=t.size("max_layer_bytes", ImagesConfig.max_layer_bytes, minimum=1 << 20),
        max_concurrent_pulls=t.integer("max_concurrent_pulls", ImagesConfig.max_concurrent_pulls, minimum=1),
        default_registry=default, allow_import_paths=allow, registries=registries,
        max_snapshot_depth=t.integer("max_snapshot_depth", ImagesConfig.max_snapshot_depth, minimum=1),
        max_fork_count=t.integer("max_fork_count", ImagesConfig.max_fork_count, minimum=1),
        snapshot_ttl_s=t.number("snapshot_ttl_s", ImagesConfig.snapshot_ttl_s, lambda v: v >= 1.0, "must be a number >= 1"),
    )  # fmt: skip
    t.done()
    return config


def _aliases(t: Table) -> Mapping[str, str]:
    found = {}
    for name in sorted(t.data):
        key = str(name)
        try:
            check_image_reference(key, t.path(key))
            found[key] = check_image_reference(t.string(key, None, "must be an image reference"), t.path(key))
        except SpecError as exc:
            raise ConfigError(t.path(key), "must map an image reference to an image reference or id", exc.value) from None
    t.done()
    return MappingProxyType(found)


def _registry(t: Table) -> RegistryConfig:
    host = t.string("host", None, "must be a registry host[:port]")
    try:
        check_image_reference(f"{host}/probe", t.path("host"))
    except SpecError:
        raise ConfigError(t.path("host"), "must be a registry host[:port]", host) from None
    username = t.get("username")
    password_env = t.get("password_env")
    for key, value in (("username", username), ("password_env", password_env)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(t.path(key), "must be a non-empty string", value)
    if (username is None) != (password_env is None):
        raise ConfigError(t.path("password_env"), "must be given with username (basic auth), or neither", password_env)
    insecure = t.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(t.path("insecure"), "must be a boolean", insecure)
    t.done()
    return RegistryConfig(host, username, password_env, insecure)


def make_image_store(config: ImagesConfig, environ: Mapping[str, str] | None = None) -> Any:
    """The node's ``ImageStore`` (blocking: it opens the store and removes anything a killed
    process left half-unpacked). Passwords are read from the environment here."""
    from arl_tangram.managers.images.config import ImageStoreConfig, RegistryCredentials
    from arl_tangram.managers.images.store import ImageStore

    env = os.environ if environ is None else environ
    creds = []
    for i, r in enumerate(config.registries):
        password = ""
        if r.password_env is not None:
            found = env.get(r.password_env)
            if found is None:
                raise ConfigError(f"images.registries[{i}].password_env", "must name a set environment variable", r.password_env)
            password = found
        # the store's credentials take "" for none (anonymous, or bearer tokens the registry hands out)
        creds.append(RegistryCredentials(host=r.host, username=r.username or "", password=password, insecure=r.insecure))
    return ImageStore(
        ImageStoreConfig(
            store_path=Path(config.store_path), max_store_bytes=config.max_store_bytes, registries=tuple(creds),
            max_concurrent_pulls=config.max_concurrent_pulls, default_registry=config.default_registry,
            max_layer_bytes=config.max_layer_bytes,
        )
    )  # fmt: skip


def open_snapshots(config: ImagesConfig, images: Any) -> Any:
    """The node's snapshots, kept under ``<store_path>/snapshots`` (blocking: it removes what
    a killed process left half-written)."""
    from arl_tangram.agent.snapshots import NodeSnapshots
    from arl_tangram.managers.cpu.snapshot_store import SnapshotStore

    store = SnapshotStore(Path(config.store_path) / "snapshots", max_depth=config.max_snapshot_depth)
    return NodeSnapshots(store, images)


@dataclass(frozen=True)
class SnapshotSettings:
    """``max_fork_count``: the most children one fork makes; ``ttl_s``: a snapshot's idle
    lease (renewed by a fork or an env created from it); ``max_depth``: layers a chain of
    snapshots may stack before the next one is squashed."""

    max_fork_count: int = 64
    ttl_s: float = 3600.0
    max_depth: int = 16


def snapshot_settings(config: ImagesConfig | None) -> SnapshotSettings:
    if config is None:
        return SnapshotSettings()
    return SnapshotSettings(config.max_fork_count, config.snapshot_ttl_s, config.max_snapshot_depth)
