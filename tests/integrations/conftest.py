"""Fixtures of the integration tests: a server with the compat faces (tests/compat's
``serve_compat``) and asyncio for the async adapters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat

TOKEN = "tok-integrations"


@pytest.fixture(scope="module")
def tangram() -> Iterator[ServerThread]:
    needs_sandbox_host()
    with serve_compat(tokens={TOKEN: "rl"}) as s:
        yield s


