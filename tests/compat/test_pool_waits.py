"""The SandboxFusion pool's borrowers waiting for a full bucket, against cancellation races.

Hundreds of verl calls wait on one bucket under load; their clients give up (the route
cancels the borrower) at about the moment their own wait times out. These tests drive the
real ``CodeEnvPool`` through those races deterministically. The runtime around it is a
stand-in (``_Runtime``) that holds one env and resets it at once: what is under test is
the pool's waiting, not the sandboxes (``test_sandboxfusion`` runs those for real).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.api.compat.pool import CodeEnvPool
from arl_tangram.api.state import Overloaded

pytestmark = pytest.mark.anyio
TENANT, MEM = "default", 1 << 30


class _Runtime:
    """What the pool reads of the server: one live env, whose reset always succeeds."""

    def __init__(self) -> None:
        self.stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closing = False
        ok = SimpleNamespace(ok=True, stderr_text="", error=None, outcome="ok")
        cpu = SimpleNamespace(exec=lambda *_a, **_k: ok)
        self.controller = SimpleNamespace(
            env_specs={"env-1": object()}, renew_env=lambda _e: None, env_node=lambda _e: SimpleNamespace(cpu=cpu)
        )


def _full_pool() -> CodeEnvPool:
    """A pool of one env, borrowed: every new borrower waits for it to come back."""
    pool = CodeEnvPool(_Runtime(), max_envs=1, max_idle=1, acquire_timeout_s=30.0)  # type: ignore[arg-type]
    pool._bucket(TENANT, MEM).live = 1
    return pool


async def _until(pred: Any) -> None:
    for _ in range(1000):
        if pred():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never happened")


async def test_a_borrower_cancelled_as_its_wait_times_out_leaves_the_pool_usable() -> None:
    """The wait times out while another task holds the bucket's lock, and the client goes
    away before the borrower gets the lock back. The bucket must stay usable: the env given
    back goes to the next borrower. (A wait run by ``asyncio.wait_for`` left its inner wait
    holding the lock forever here: every later borrower of the bucket hung.)"""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    waiter = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=0.05))
    await _until(lambda: bucket.changed._waiters)
    await bucket.changed.acquire()  # held through the waiter's timeout
    await asyncio.sleep(0.15)
    waiter.cancel()  # the client is gone ...
    bucket.changed.release()  # ... in the same step as the lock frees
    with pytest.raises((asyncio.CancelledError, Overloaded)):
        await waiter
    await asyncio.sleep(0.01)
    assert not bucket.changed.locked(), "the bucket's lock is held by nobody's task"
    nxt = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=2.0))
    await asyncio.sleep(0.01)
    pool.release(TENANT, MEM, "env-1")
    assert await asyncio.wait_for(nxt, 3.0) == "env-1"


async def test_a_wakeup_taken_by_a_borrower_that_is_cancelled_passes_to_the_next() -> None:
    """An env comes back and wakes one borrower, whose client goes away before it runs:
    the next borrower must get the env, not wait out its timeout beside an idle env."""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    first = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=5.0))
    await _until(lambda: len(bucket.changed._waiters) == 1)
    second = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=5.0))
    await _until(lambda: len(bucket.changed._waiters) == 2)
    async with bucket.changed:
        bucket.idle.append("env-1")
        bucket.changed.notify()  # wakes ``first`` only
        first.cancel()  # its client goes away before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1.0) == "env-1"
