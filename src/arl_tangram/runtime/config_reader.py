"""Shell: the reading machinery of the configuration file: the TOML/YAML parse, one table
read key by key with errors that name the field path and the rule, sizes in bytes.

Who calls: the section readers in ``config`` and ``config_service``; nothing else.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from arl_tangram.core.errors import SpecError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip


class ConfigError(SpecError):
    """A configuration value broke a rule; ``field`` is its path (``providers[1].rps``)."""


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


class Table:
    """One mapping of the file; every key read is checked off, ``done`` rejects the rest."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(where or "<file>", "must be a table (mapping)", type(data).__name__)
        self.data, self.where, self.seen = data, where, set[str]()
        self.secret = False  # True: never print an unknown key's value (a table of credentials)

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def table(self, key: str) -> Table:
        return Table(self.get(key, {}), self.path(key))

    def tables(self, key: str) -> list[Table]:
        items = self.get(key, [])
        if not isinstance(items, list):
            raise ConfigError(
                self.path(key), "must be an array of tables ([[...]])", type(items).__name__
            )
        return [Table(item, f"{self.path(key)}[{i}]") for i, item in enumerate(items)]

    def done(self) -> None:
        for key in sorted(set(self.data) - self.seen, key=str):
            known = ", ".join(sorted(self.seen)) or "none"
            # a misspelt "keys" or "token" must not print the secret it holds
            secret = self.secret or any(word in str(key).lower() for word in ("key", "token"))
            value = "<hidden>" if secret else self.data[key]
            raise ConfigError(self.path(str(key)), f"is not a known key (known: {known})", value)

    def integer(self, key: str, default: int, minimum: int) -> int:
        value = self.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(self.path(key), f"must be an integer >= {minimum}", value)
        return value

    def number(self, key: str, default: float, check: Callable[[float], bool], rule: str) -> float:
        value = self.get(key, default)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not check(value)
        ):
            raise ConfigError(self.path(key), f"must be a finite number {rule}", value)
        return float(value)

    def string(
        self, key: str, default: str | None, rule: str = "must be a non-empty string"
    ) -> str:
        value = self.get(key, default)
        if not isinstance(value, str) or not value:
            raise ConfigError(self.path(key), rule, value)
        return value

    def size(self, key: str, default: int, minimum: int) -> int:
        size = parse_size_bytes(self.get(key, default), self.path(key))
        if size < minimum:
            raise ConfigError(self.path(key), f"must be >= {minimum} bytes", size)
        return size


def parse_toml(text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("<file>", f"must be valid TOML: {exc}", None) from None


def parse_yaml(text: str) -> Any:
    try:
        import yaml  # optional: TOML needs nothing beyond the standard library
    except ImportError:
        raise ConfigError(
            "<file>", "YAML needs PyYAML installed (pip install pyyaml); TOML needs nothing", None
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("<file>", f"must be valid YAML: {exc}", None) from None
    return {} if data is None else data
