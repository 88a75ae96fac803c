"""Shell: configuration of a node's image store, validated on construction (``SpecError``
naming the field and the rule).

Registry passwords are secrets: they are kept out of ``repr`` and never appear in logs,
errors or status; ``password_env`` names an environment variable read at use time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from arl_tangram.core.errors import SpecError

GIB = 1 << 30


@dataclass(frozen=True)
class RegistryCredentials:
    """One registry host (``HOST[:PORT]``): credentials for basic and bearer-token auth, and
    ``insecure`` = speak plain HTTP to it (loopback test registries)."""

    host: str
    username: str = ""
    password: str = field(default="", repr=False)
    password_env: str = ""
    insecure: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host or "/" in self.host:
            raise SpecError("images.registries.host", "must be HOST or HOST:PORT", self.host)
        if self.password_env and not isinstance(self.password_env, str):
            raise SpecError("images.registries.password_env", "must be an environment variable name", self.password_env)

    def secret(self) -> str:
        """The password (from ``password``, else from the ``password_env`` variable, else "")."""
        if self.password:
            return self.password
        return os.environ.get(self.password_env, "") if self.password_env else ""


@dataclass(frozen=True)
class ImageStoreConfig:
    """``store_path``: the store's directory (made 0700 root); ``max_store_bytes``: unpacked
    bytes the store may hold (GC target, and the quota a pull is refused past);
    ``max_layer_bytes``: the cap on one layer's unpacked bytes (bombs); ``max_concurrent_pulls``:
    layer fetch+unpacks running at once on this node; ``default_registry``: where bare names
    resolve (None: a bare name is an error)."""

    store_path: Path
    max_store_bytes: int = 64 * GIB
    registries: tuple[RegistryCredentials, ...] = ()
    max_concurrent_pulls: int = 4
    default_registry: str | None = None
    max_layer_bytes: int = 16 * GIB
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "store_path", Path(self.store_path))
        object.__setattr__(self, "registries", tuple(self.registries))
        for name in ("max_store_bytes", "max_layer_bytes", "max_concurrent_pulls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SpecError(f"images.{name}", "must be a positive integer", value)
        if not all(isinstance(r, RegistryCredentials) for r in self.registries):
            raise SpecError("images.registries", "must be RegistryCredentials entries", self.registries)
        if self.default_registry is not None and (not self.default_registry or "/" in self.default_registry):
            raise SpecError("images.default_registry", "must be HOST or HOST:PORT", self.default_registry)
        if not self.request_timeout_s > 0:
            raise SpecError("images.request_timeout_s", "must be > 0", self.request_timeout_s)

    def registry(self, host: str) -> RegistryCredentials:
        """The configured entry for ``host`` (an anonymous, TLS one if none is configured)."""
        for entry in self.registries:
            if entry.host == host:
                return entry
        return RegistryCredentials(host=host)
