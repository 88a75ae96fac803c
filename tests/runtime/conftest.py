"""Fixtures of the runtime tests: async tests run on asyncio through anyio's pytest plugin;
tests with real sandboxes need a host that can run them (never skipped under CI)."""

from __future__ import annotations

import pytest

from tests.managers.cpu.conftest import IN_CI, host_can_sandbox


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sandbox_host() -> None:
    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
