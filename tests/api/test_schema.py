"""Schemathesis over the served OpenAPI schema (every route in it, see
``bench/service_fuzz``), against a real server with real sandboxes: its CLI with pinned
checks, examples per route and seed; any 5xx, undocumented status, content type, header or
body, invalid request accepted, valid request refused by a rule the schema does not state,
or method refused without ``Allow`` fails the test. ``arl-tangram bench service
--fuzz-examples N`` is the longer run."""

from __future__ import annotations

import httpx
import pytest

from arl_tangram.bench.service_fuzz import CHECKS, run_fuzz
from tests.api.conftest import serving

pytestmark = pytest.mark.usefixtures("sandbox_host")
MAX_EXAMPLES = 10  # per route and phase: about a minute on a quiet 2-core host


@pytest.mark.timeout(600)
def test_schemathesis_finds_no_5xx_and_no_schema_violation(sandbox_host: None) -> None:
    with serving(create_timeout_s=2.0, max_queued_actions=64) as server:
        schema = httpx.get(f"{server.url}/openapi.json").json()
        assert len(schema["paths"]) >= 15
        assert "not_a_server_error" in CHECKS and "unsupported_method" in CHECKS
        result = run_fuzz(server.url, max_examples=MAX_EXAMPLES, timeout_s=540)
    assert result.rc == 0, result.summary
