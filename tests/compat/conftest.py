"""Fixtures of the compat-face tests: the native app with the faces mounted, served by
uvicorn on a free loopback port in a thread, driven by the real client packages.

A server lives for one module (its runtime start and warm sandboxes are shared by the
module's tests); its teardown checks that it left no process, cgroup, mount or temp dir."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from arl_tangram.api.app import create_app
from arl_tangram.api.compat import mount_compat
from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import TangramConfig
from tests.conftest import _snapshot, assert_nothing_left_since
from tests.managers.cpu.conftest import IN_CI, host_can_sandbox


def needs_sandbox_host() -> None:
    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")


@contextmanager
def serve_compat(config: TangramConfig | None = None, *, tokens: dict[str, str] | None = None, **compat: Any) -> Iterator[ServerThread]:
    """The app (``create_app`` + ``mount_compat``) served until the block ends; then the
    runtime is closed and nothing it started may remain."""
    before = _snapshot()
    app = create_app(config, tokens=tokens)
    mount_compat(app, config=config, **compat)
    with ServerThread(app) as server:
        yield server
    assert_nothing_left_since(before, "the server")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    needs_sandbox_host()
    with serve_compat(max_envs=8, max_idle=4) as s:
        yield s


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Replaces the suite's per-test check here: a module's server keeps warm pooled
    sandboxes from one test to the next by design, so ``serve_compat`` checks the server's
    whole life instead (nothing may remain once it has stopped)."""
    yield
