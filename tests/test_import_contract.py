"""Import contract (DESIGN.md §2): the dependency direction between packages, checked on the
source with ``ast`` (so lazy, function-level imports count too).

cli, api, bench -> runtime, client -> agent, backends -> managers -> core;
integrations -> client;  sim -> runtime's loop -> core.
core imports nothing of the project outside core, and of the standard library only the
modules it names (an allowlist: no I/O, clock, randomness, ids or concurrency).
Nothing imports bench or cli.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "arl_tangram"

# Sans-I/O core: pure computation only. Anything else (asyncio, time, datetime, uuid,
# secrets, random, queue, concurrent, os, logging, ...) is refused.
CORE_ALLOWED_STDLIB = {
    "__future__", "abc", "bisect", "collections", "dataclasses", "enum", "fractions", "functools",
    "heapq", "itertools", "math", "numbers", "operator", "statistics", "types", "typing",
}
CORE_ALLOWED_THIRD_PARTY = {"numpy"}
SIM_ALLOWED_THIRD_PARTY = {"numpy", "matplotlib", "simpy", "scipy"}

# What each top-level package may import from the project (besides itself).
ALLOWED_PROJECT_DEPS: dict[str, set[str]] = {
    "core": set(),
    "sim": {"core", "runtime.loop"},  # the one controller loop, which imports only core
    "managers": {"core"},
    "agent": {"managers", "core"},
    "backends": {"agent", "managers", "core"},
    "runtime": {"agent", "backends", "managers", "core"},
    "client": {"runtime", "agent", "backends", "managers", "core"},
    "api": {"runtime", "client", "agent", "backends", "managers", "core"},
    "integrations": {"client"},
    "bench": {"runtime", "client", "agent", "backends", "managers", "core", "sim"},
    "cli": {"runtime", "client", "agent", "backends", "managers", "core", "sim", "bench", "api", "integrations", "cli_images"},
    "cli_images": {"runtime", "client", "agent", "backends", "managers", "core"},  # the CLI's `image` commands
    "": {"core", "client"},  # the package's own __init__ (connect, imported lazily)
}
LAYERS = set(ALLOWED_PROJECT_DEPS) - {""}


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of every module imported anywhere in ``source`` (relative ones resolved)."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            found.add(prefix)
            # ``from arl_tangram import sim`` imports the subpackage (``__version__`` is a name)
            found.update(f"{prefix}.{a.name}" for a in node.names if prefix == "arl_tangram" and a.name in LAYERS)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) < 2:
        return ""
    return parts[1]


def violations_of(module: str, imported: set[str]) -> list[str]:
    layer = layer_of(module)
    out: list[str] = []
    stdlib = sys.stdlib_module_names
    for name in sorted(imported):
        top = name.split(".")[0]
        if top == "arl_tangram":
            target = layer_of(name)
            allowed = ALLOWED_PROJECT_DEPS.get(layer, set())
            within = ".".join(name.split(".")[1:3])  # e.g. runtime.loop
            if target in ("", layer) or target in allowed or within in allowed:
                continue
            out.append(f"{module} imports {name} ({layer or 'arl_tangram'} -> {target} breaks the direction)")
            continue
        if top == "__future__":
            continue
        if layer == "core":
            if top in stdlib and top not in CORE_ALLOWED_STDLIB:
                out.append(f"{module} imports {name} (core is sans-I/O: not on its stdlib allowlist)")
            elif top not in stdlib and top not in CORE_ALLOWED_THIRD_PARTY:
                out.append(f"{module} imports third-party {name}")
        elif layer == "sim" and top not in stdlib and top not in SIM_ALLOWED_THIRD_PARTY:
            out.append(f"{module} imports third-party {name} (sim: stdlib, numpy, matplotlib)")
    return out


def test_the_loop_imports_only_core() -> None:
    """The simulator uses the controller loop, so the loop must not pull in managers or torch."""
    path = PKG / "runtime" / "loop.py"
    imported = imports_of(path.read_text(encoding="utf-8"), "arl_tangram.runtime.loop", False)
    project = {n for n in imported if n.startswith("arl_tangram")}
    assert project and all(layer_of(n) == "core" for n in project), sorted(project)
    assert all(n.split(".")[0] in sys.stdlib_module_names for n in imported - project), sorted(imported)


def all_modules() -> list[tuple[str, Path]]:
    return sorted((module_name(p), p) for p in PKG.rglob("*.py"))


def test_the_source_tree_is_found() -> None:
    names = {m for m, _ in all_modules()}
    assert {"arl_tangram.core.scheduler", "arl_tangram.sim.runner", "arl_tangram.cli"} <= names
    assert len(names) > 30


def test_dependency_direction() -> None:
    problems: list[str] = []
    for module, path in all_modules():
        imported = imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        problems += violations_of(module, imported)
    assert not problems, "\n".join(problems)


def test_nothing_imports_bench_or_cli() -> None:
    problems = []
    for module, path in all_modules():
        if layer_of(module) in ("cli", "cli_images", "bench"):
            continue
        for name in imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
            if layer_of(name) in ("bench", "cli", "cli_images"):  # arl_tangram.client is not arl_tangram.cli
                problems.append(f"{module} imports {name}")
    assert not problems, problems


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        ("arl_tangram.core.x", "import asyncio\n", "sans-I/O"),
        ("arl_tangram.core.x", "def f():\n    import time\n", "sans-I/O"),
        ("arl_tangram.core.x", "from os import path\n", "sans-I/O"),
        ("arl_tangram.core.x", "import datetime\n", "sans-I/O"),
        ("arl_tangram.core.x", "import uuid\n", "sans-I/O"),
        ("arl_tangram.core.x", "from secrets import token_hex\n", "sans-I/O"),
        ("arl_tangram.core.x", "import queue\n", "sans-I/O"),
        ("arl_tangram.core.x", "from concurrent.futures import Future\n", "sans-I/O"),
        ("arl_tangram.sim.x", "from arl_tangram.runtime.controller import Controller\n", "sim -> runtime"),
        ("arl_tangram.integrations.verl", "from arl_tangram.runtime import loop\n", "integrations -> runtime"),
        ("arl_tangram.core.x", "from arl_tangram.sim import runner\n", "core -> sim"),
        ("arl_tangram.core.policies.x", "from ...sim.engine import EventQueue\n", "core -> sim"),
        ("arl_tangram.core.x", "import torch\n", "third-party"),
        ("arl_tangram.sim.x", "from arl_tangram.managers.gpu import GpuManager\n", "sim -> managers"),
        ("arl_tangram.sim.x", "import torch\n", "third-party"),
        ("arl_tangram.managers.cpu.x", "from arl_tangram.runtime import loop\n", "managers -> runtime"),
        ("arl_tangram.managers.cpu.x", "from arl_tangram import sim\n", "managers -> sim"),
        ("arl_tangram.runtime.x", "import arl_tangram.cli\n", "runtime -> cli"),
        ("arl_tangram.api.x", "from arl_tangram.bench import cpu\n", "api -> bench"),
    ],
)
def test_the_checker_catches_violations(module: str, source: str, complaint: str) -> None:
    is_package = False
    found = violations_of(module, imports_of(source, module, is_package))
    assert any(complaint in v for v in found), found


def test_the_checker_allows_the_direction() -> None:
    ok = [
        ("arl_tangram.core.policies.x", "from ..state import StateEditor\nimport math, heapq\nimport numpy as np\n"),
        ("arl_tangram.sim.x", "import os, time, multiprocessing\nimport numpy\nfrom arl_tangram.core import ledger\n"),
        ("arl_tangram.managers.gpu.x", "import torch\nfrom arl_tangram.core.chunks import free_chunks\n"),
        ("arl_tangram.cli", "from arl_tangram.bench import cpu\n"),
        ("arl_tangram.sim.x", "from arl_tangram.runtime.loop import ControllerLoop\n"),
        ("arl_tangram.integrations.verl", "from arl_tangram.client import connect\n"),
    ]
    for module, source in ok:
        assert violations_of(module, imports_of(source, module, False)) == [], module
