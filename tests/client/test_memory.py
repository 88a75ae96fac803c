"""Memory per action through the SDK (issue 21), on real sandboxes: ``exec(memory=...)``
is the run's grant; over it the run pauses, the core grows it (the node has the memory)
and it succeeds; with pause-and-grow off the same run dies at its grant. A demand above
the env's limit is a ``SpecError`` naming ``memory``."""

from __future__ import annotations

import pytest

from arl_tangram.client import AsyncClient, SpecError
from tests.client.conftest import controller_of

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
HOG = "python3 -c \"b = b'x' * (100 << 20); print('ok', len(b) >> 20)\""


async def test_a_run_over_its_memory_grant_pauses_and_grows(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    r = await env.exec(HOG, memory="48MiB", timeout_s=30)
    assert (r.outcome, r.stdout.strip()) == ("succeeded", "ok 100"), (r.outcome, r.cause, r.stderr)
    await env.release()


async def test_with_pause_and_grow_off_the_same_run_dies_at_its_grant(tg: AsyncClient) -> None:
    controller_of(tg).executor.memory_pause = False
    try:
        env = await tg.create_env(memory="256MiB")
        r = await env.exec(HOG, memory="48MiB", timeout_s=30)
        assert r.outcome == "oom_killed", (r.outcome, r.cause)
        await env.release()
    finally:
        controller_of(tg).executor.memory_pause = True


async def test_memory_above_the_env_limit_is_a_spec_error(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="64MiB")
    with pytest.raises(SpecError, match="memory"):
        await env.exec("true", memory="1GiB")
    await env.release()


@pytest.mark.parametrize("transport", ["embedded"])  # the mechanism, not the transport, is tested
async def test_an_undeclared_run_writing_past_its_learned_grant_pauses_and_succeeds(tg: AsyncClient) -> None:
    """Three tiny runs of a kind teach the core a grant of a few MiB; the next run of that
    kind writes 200 MiB into its tmpfs /tmp, charged by write(): it pauses, grows and
    succeeds (a hard limit at the grant failed that write with ENOMEM)."""
    env = await tg.create_env(memory="512MiB", tmp="256MiB", workspace="16MiB")
    for _ in range(3):
        assert (await env.exec("true", kind="writer", timeout_s=30)).ok
    r = await env.exec("head -c 200M /dev/zero > /tmp/big && echo wrote", kind="writer", timeout_s=60)
    assert (r.outcome, r.stdout.strip()) == ("succeeded", "wrote"), (r.outcome, r.cause, r.stderr[-400:])
    assert r.paused_s > 0 and r.queue_s >= r.paused_s  # it paused; paused time is queue time
    await env.release()
