"""Admission: a tenant's limits (envs, memory, concurrent actions) and the service's bound
on unfinished actions are enforced synchronously, with nothing queued, and one tenant's
limit never refuses another tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import arl_tangram
from arl_tangram.client import AsyncClient
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import TenantConfig
from arl_tangram.runtime.controller import Controller
from arl_tangram.runtime.embedded import EmbeddedRuntime
from arl_tangram.runtime.errors import OverloadedError, TenantLimitError
from tests.runtime.builders import NOOP, config, noop_spec

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]  # a runtime starts a real CPU manager

LIMITED = {
    "a": TenantConfig("a", max_envs=1, max_concurrent_actions=2, max_mem_bytes=400 << 20),
    "b": TenantConfig("b", max_mem_bytes=300 << 20),
}


@pytest.fixture
async def runtime() -> AsyncIterator[EmbeddedRuntime]:
    rt = await EmbeddedRuntime.start(config(tenants=LIMITED, max_queued_actions=5))
    try:
        yield rt
    finally:
        await rt.aclose()


def _pending(c: Controller) -> int:
    return c.loop.pending + len(c.loop.state.queued())


async def test_concurrent_actions_of_a_tenant_are_bounded_and_nothing_is_queued(runtime: EmbeddedRuntime) -> None:
    c = runtime.controller
    # submit is synchronous: without an await between them, none of these has ended yet
    first, second = c.submit(noop_spec(tenant="a"), NOOP), c.submit(noop_spec(tenant="a"), NOOP)
    before = _pending(c)
    with pytest.raises(TenantLimitError) as info:
        c.submit(noop_spec(tenant="a", action_id="refused"), NOOP)
    assert isinstance(info.value, SpecError) and info.value.field == "tenants.a.max_concurrent_actions"
    assert c.get("refused") is None and _pending(c) == before
    other = c.submit(noop_spec(tenant="b"), NOOP)  # another tenant is not refused
    for record in (first, second, other):
        assert (await c.wait(record.spec.action_id, 5.0)).ok
    c.submit(noop_spec(tenant="a"), NOOP)  # ended actions no longer count


async def test_the_service_bound_refuses_with_a_retry_hint(runtime: EmbeddedRuntime) -> None:
    c = runtime.controller
    records = [c.submit(noop_spec(tenant=f"t{i}"), NOOP) for i in range(5)]
    with pytest.raises(OverloadedError) as info:
        c.submit(noop_spec(tenant="t9", action_id="over"), NOOP)
    assert info.value.retry_after_s > 0 and info.value.limit == 5 and c.get("over") is None
    for record in records:
        assert (await c.wait(record.spec.action_id, 5.0)).ok
    assert (await c.wait(c.submit(noop_spec(tenant="t9"), NOOP).spec.action_id, 5.0)).ok


async def test_env_count_and_memory_limits_per_tenant() -> None:
    async with arl_tangram.connect(config=config(tenants=LIMITED), tenant="a") as a:
        b = AsyncClient(a.transport, tenant="b")
        c: Controller = a.transport.controller  # type: ignore[attr-defined]
        env = await a.create_env(memory="256MiB")
        with pytest.raises(TenantLimitError, match="max_envs"):
            await a.create_env(memory="16MiB", env_id="refused-a")
        with pytest.raises(TenantLimitError, match="max_mem_bytes"):
            await b.create_env(memory="512MiB", env_id="refused-b")  # over b's memory on its own
        assert "refused-a" not in c.env_specs and "refused-b" not in c.env_specs
        assert c.leases.envs_of("a") == 1 and c.leases.mem_bytes_of("b") == 0
        env_b = await b.create_env(memory="256MiB")  # a's envs do not count against b
        await env.release()
        replacement = await a.create_env(memory="256MiB")  # a released env frees its slot
        await replacement.release()
        await env_b.release()
