"""Shell: the ``[e2b]`` table of the configuration: the E2B-compatible face's knobs.

Example::

    [e2b]
    prefix = "/e2b"                   # E2B_API_URL and E2B_SANDBOX_URL are <server>/e2b
    domain = "tangram.local"          # the `domain` sandboxes report (the 49983-<id>.<domain> host form)
    memory = "1GiB"                   # each sandbox's memory limit (E2B sandboxes have no per-call size)
    cpu = "1-4"                       # a command's default cores: "n" or "min-max" (elastic)
    image_key = "image"               # metadata key holding a per-sandbox image (slime's)
    max_timeout_s = 86400             # the longest sandbox timeout (TTL) a caller may ask
    warm = 2                          # started sandboxes kept ready per (tenant, template, memory) once asked for
    [e2b.templates]                   # template id or alias -> image reference ("host": the host root)
    base = "host"
    python = "127.0.0.1:5000/library/python:3.12"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from arl_tangram.runtime.config_reader import ConfigError, Table

CPU_PATTERN = re.compile(r"^([1-9][0-9]{0,3})(?:-([1-9][0-9]{0,3}))?$")


def parse_cpu(value: object, where: str) -> tuple[int, int]:
    """(min, max) cores of a cpu hint ``"n"`` or ``"min-max"`` (or an int); ``ConfigError``
    (a ``SpecError``) naming ``where`` otherwise."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    match = CPU_PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(where, 'must be a core count "n" or a range "min-max" (1..9999)', value)
    lo = int(match.group(1))
    hi = int(match.group(2) or lo)
    if lo > hi:
        raise ConfigError(where, "must have min <= max", value)
    return lo, hi


@dataclass(frozen=True)
class E2bConfig:
    prefix: str = "/e2b"
    domain: str = "tangram.local"
    mem_bytes: int = 1 << 30
    cpu: tuple[int, int] = (1, 1)
    image_key: str = "image"
    max_timeout_s: int = 86400
    warm: int = 0  # ready spares per (tenant, image, memory); each holds its memory while it waits
    templates: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({"base": "host"}))


def read_e2b(t: Table) -> E2bConfig:
    """The ``[e2b]`` table; its defaults when absent."""
    if not t.data:
        return E2bConfig()
    prefix = t.string("prefix", E2bConfig.prefix)
    if not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", prefix):
        raise ConfigError(t.path("prefix"), "must be a URL path like /e2b (no trailing slash)", prefix)
    templates = t.table("templates")
    aliases = {}
    for alias in sorted(templates.data):
        aliases[str(alias)] = templates.string(str(alias), None, "must be an image reference or host")
    templates.done()
    config = E2bConfig(
        prefix=prefix, domain=t.string("domain", E2bConfig.domain),
        mem_bytes=t.size("memory", E2bConfig.mem_bytes, minimum=16 << 20),
        cpu=parse_cpu(t.get("cpu", "1"), t.path("cpu")), image_key=t.string("image_key", E2bConfig.image_key),
        max_timeout_s=t.integer("max_timeout_s", E2bConfig.max_timeout_s, minimum=1),
        warm=t.integer("warm", E2bConfig.warm, minimum=0),
        templates=MappingProxyType(aliases or {"base": "host"}),
    )  # fmt: skip
    t.done()
    return config
