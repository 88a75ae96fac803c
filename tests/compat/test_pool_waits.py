"""The SandboxFusion pool's borrowers waiting for a full bucket, against load and cancellation.

Hundreds of verl calls wait on one bucket under load; their clients give up (the route
cancels the borrower) at about the moment their own wait times out. These tests drive the
real ``CodeEnvPool`` through those races deterministically. The runtime around it is a
stand-in (``_Runtime``) whose envs are all live and reset at once: what is under test is
the pool's waiting, not the sandboxes (``test_sandboxfusion`` runs those for real).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.api.compat.pool import CodeEnvPool
from arl_tangram.api.state import Overloaded

pytestmark = pytest.mark.anyio
TENANT, MEM = "default", 1 << 30


class _LiveEnvs(dict[str, object]):
    """Every env id is live (the controller's ``env_specs`` as the pool reads it)."""

    def __contains__(self, _key: object) -> bool:
        return True


class _Runtime:
    """What the pool reads of the server: live envs whose resets always succeed."""

    def __init__(self) -> None:
        self.stopping: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closing = False
        cpu = SimpleNamespace(empty_dirs=lambda *_a, **_k: (True, ""))
        self.controller = SimpleNamespace(
            env_specs=_LiveEnvs(), renew_env=lambda _e: None, env_node=lambda _e: SimpleNamespace(cpu=cpu)
        )


def _full_pool(size: int = 1) -> CodeEnvPool:
    """A pool of ``size`` envs, all borrowed: every new borrower waits for one to come back."""
    pool = CodeEnvPool(_Runtime(), max_envs=size, max_idle=size, acquire_timeout_s=30.0)  # type: ignore[arg-type]
    pool._bucket(TENANT, MEM).live = size
    return pool


async def _until(pred: Any) -> None:
    for _ in range(1000):
        if pred():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never happened")


async def test_an_env_handed_to_a_borrower_that_is_cancelled_passes_to_the_next() -> None:
    """An env comes back to the oldest borrower, whose client goes away before it runs:
    the next borrower must get the env, not wait out its timeout beside an idle env."""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    first = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=5.0))
    await _until(lambda: len(bucket.lines.waiters) == 1)
    second = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=5.0))
    await _until(lambda: len(bucket.lines.waiters) == 2)
    pool._pass_on(bucket, "env-1")  # handed to ``first`` ...
    first.cancel()  # ... whose client goes away before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1.0) == "env-1"


async def test_borrowers_timing_out_together_leave_the_bucket_usable() -> None:
    """Fifty borrowers time out at once (their clients give up besides): the bucket must
    still serve the next borrower the env given back. (A condition's lock, taken back by
    ``wait_for``'s inner task after a cancel had released it, once hung a bucket for good.)"""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    waiting = [asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=0.05)) for _ in range(50)]
    await _until(lambda: len(bucket.lines.waiters) == 50)
    for task in waiting[::2]:
        task.cancel()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, (Overloaded, asyncio.CancelledError)) for r in results)
    assert not bucket.lines.waiters
    nxt = asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=2.0))
    await _until(lambda: len(bucket.lines.waiters) == 1)
    pool.release(TENANT, MEM, "env-1")
    assert await asyncio.wait_for(nxt, 3.0) == "env-1"


async def test_envs_given_back_reach_every_waiter_in_one_pass_of_the_loop() -> None:
    """Under load the event loop runs a few iterations a second; envs coming back must not
    reach their waiters one loop iteration each (433 borrowers once queued on a condition's
    lock beside 96 idle envs): handed over directly, all are taken in one pass."""
    n = 200
    pool = _full_pool(n)
    bucket = pool._bucket(TENANT, MEM)
    waiting = [asyncio.create_task(pool.acquire(TENANT, MEM, timeout_s=5.0)) for _ in range(n)]
    await _until(lambda: len(bucket.lines.waiters) == n)
    for i in range(n):
        pool._pass_on(bucket, f"env-{i}")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert sum(t.done() for t in waiting) == n
    assert sorted(t.result() for t in waiting) == sorted(f"env-{i}" for i in range(n))


async def test_a_retry_is_handed_an_env_before_older_first_attempts() -> None:
    """verl retries a 504: the retry (``retry=True``) waits in the bucket's retry line, which
    is served before the borrowers that were already waiting."""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    first = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0))
    await _until(lambda: len(bucket.lines.waiters) == 1)
    retry = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, retry=True))
    await _until(lambda: len(bucket.lines.retries) == 1)
    pool._pass_on(bucket, "env-1")
    assert await asyncio.wait_for(retry, 3.0) == "env-1"
    assert not first.done()
    pool._pass_on(bucket, "env-2")
    assert await asyncio.wait_for(first, 3.0) == "env-2"


def test_the_retry_memory_marks_a_call_answered_504_once() -> None:
    from types import SimpleNamespace

    from arl_tangram.api.compat.retries import RetryMemory, key

    body = SimpleNamespace(language="python", code="print(1)", stdin="1 2\n", compile_timeout=3, run_timeout=3, memory_limit_MB=1024)
    other = SimpleNamespace(**{**vars(body), "stdin": "3 4\n"})
    memory = RetryMemory()
    assert not memory.take(key("t", body))
    memory.note(key("t", body))
    assert not memory.take(key("t", other)) and not memory.take(key("u", body))  # another case, another tenant
    assert memory.take(key("t", body))
    assert not memory.take(key("t", body))  # one priority pass per 504


class _Program:
    """A program's state as the pool asks it (``compat.long_programs`` stands behind it in
    the face): whether a probe of it is in flight, whether it is known to run long."""

    def __init__(self, probing: bool = False, long: bool = False) -> None:
        self.probing, self.long = probing, long


async def test_a_call_whose_program_is_being_probed_waits_beside_idle_envs_until_the_probe_ends() -> None:
    """The probe's run shows whether the program is short: its sibling must not take an idle
    env meanwhile (a looping sibling would hold it for its whole timeout), and must get one,
    ahead of older waiters, as soon as the probe ends short."""
    pool = _full_pool(2)
    bucket = pool._bucket(TENANT, MEM)
    pool.release(TENANT, MEM, "env-1")  # one env idle
    await _until(lambda: bucket.idle == ["env-1"])
    program = _Program(probing=True)
    sibling = asyncio.ensure_future(
        pool.acquire(TENANT, MEM, 5.0, long=lambda: program.long, probing=lambda: program.probing)
    )
    await _until(lambda: len(bucket.lines.probing) == 1)
    await asyncio.sleep(0.05)
    assert not sibling.done() and bucket.idle == ["env-1"]
    program.probing = False  # the probe ended short
    pool.recheck_probing()
    assert await asyncio.wait_for(sibling, 1.0) == "env-1"


async def test_a_call_whose_program_ran_long_waits_behind_the_others_until_it_is_due() -> None:
    """A program seen long (its probe was demoted): its sibling is served after every call
    not known to be long, except once its own start-by time is near (aging)."""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    looping = _Program(long=True)
    held = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, long=lambda: looping.long))
    await _until(lambda: len(bucket.lines.waiters) == 1)
    short = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, long=lambda: False))
    await _until(lambda: len(bucket.lines.waiters) == 2)
    pool._pass_on(bucket, "env-1")
    assert await asyncio.wait_for(short, 1.0) == "env-1"
    assert not held.done() and len(bucket.lines.held) == 1
    late = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0))
    await _until(lambda: len(bucket.lines.waiters) == 1)
    bucket.lines.held[0].due = 0.0  # its start-by time has come near
    pool._pass_on(bucket, "env-2")
    assert await asyncio.wait_for(held, 1.0) == "env-2"
    pool._pass_on(bucket, "env-3")
    assert await asyncio.wait_for(late, 1.0) == "env-3"


async def test_a_retry_known_long_goes_after_the_short_retries() -> None:
    """Retries are served first, and among them one not known to run long before one known
    long: a long run holds its env for its whole timeout (measured, ``bench verdicts``
    256-half-loop: short retries behind a crowd of looping ones waited 6-10 s)."""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    looping = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, retry=True, long=lambda: True))
    await _until(lambda: len(bucket.lines.retries) == 1)
    short = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, retry=True, long=lambda: False))
    first = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0))
    await _until(lambda: len(bucket.lines.retries) == 2 and len(bucket.lines.waiters) == 1)
    pool._pass_on(bucket, "env-1")
    assert await asyncio.wait_for(short, 1.0) == "env-1"
    pool._pass_on(bucket, "env-2")
    assert await asyncio.wait_for(looping, 1.0) == "env-2"  # still before first attempts
    pool._pass_on(bucket, "env-3")
    assert await asyncio.wait_for(first, 1.0) == "env-3"


async def test_a_due_call_known_long_does_not_pass_a_due_call_not_known_long() -> None:
    """Both start-by times near, one env: the call not known to be long gets it; the long
    one's is the 504 (its retry is served first), not the short one's."""
    pool = _full_pool()
    bucket = pool._bucket(TENANT, MEM)
    held = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, long=lambda: True))
    await _until(lambda: len(bucket.lines.waiters) == 1)
    short = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, long=lambda: False))
    await _until(lambda: len(bucket.lines.waiters) == 2)
    pool._pass_on(bucket, "env-1")  # the long one moves to ``held`` on the way
    assert await asyncio.wait_for(short, 1.0) == "env-1"
    late = asyncio.ensure_future(pool.acquire(TENANT, MEM, 5.0, long=lambda: False))
    await _until(lambda: len(bucket.lines.held) == 1 and len(bucket.lines.waiters) == 1)
    bucket.lines.held[0].due = bucket.lines.waiters[0].due = 0.0  # both start-by times near
    pool._pass_on(bucket, "env-2")
    assert await asyncio.wait_for(late, 1.0) == "env-2" and not held.done()
    pool._pass_on(bucket, "env-3")
    assert await asyncio.wait_for(held, 1.0) == "env-3"


async def test_a_probe_ends_once_and_its_demoted_run_marks_the_program_long() -> None:
    from types import SimpleNamespace

    from arl_tangram.api.compat.long_programs import LongPrograms, key

    programs, changes = LongPrograms(), []
    programs.on_change = lambda: changes.append(1)
    body = SimpleNamespace(language="python", code="while True: pass\n")
    program = key("t", body)
    assert key("u", body) != program and key("t", SimpleNamespace(language="python", code="pass\n")) != program
    probe = programs.start(program)
    assert programs.is_probing(program) and not programs.is_long(program)
    record = SimpleNamespace(on_demoted=[], started_s=None)
    probe.watch(record)  # type: ignore[arg-type]
    for callback in record.on_demoted:  # what ``ActionRecord.note_demoted`` does
        callback()
    assert programs.is_long(program) and not programs.is_probing(program) and changes == [1]
    probe.end()
    assert changes == [1]  # idempotent
    short = key("t", SimpleNamespace(language="python", code="print(1)\n"))
    programs.start(short).end()
    assert not programs.is_probing(short) and not programs.is_long(short) and changes == [1, 1]


async def test_a_probe_whose_run_goes_on_without_computing_stops_holding_its_siblings() -> None:
    """A slow program that does not compute (a sleep) is never demoted: once its probe's run
    has run ``PROBE_WINDOW_S`` it decides nothing, and its siblings must not wait for its end."""
    from types import SimpleNamespace

    from arl_tangram.api.compat import long_programs

    programs = long_programs.LongPrograms()
    program = long_programs.key("t", SimpleNamespace(language="bash", code="sleep 30\n"))
    probe = programs.start(program)
    record = SimpleNamespace(on_demoted=[], started_s=None)
    probe.watch(record)  # type: ignore[arg-type]
    assert programs.is_probing(program)  # queued: it will tell
    record.started_s = time.monotonic()
    assert programs.is_probing(program)  # running: it may still tell
    record.started_s = time.monotonic() - long_programs.PROBE_WINDOW_S
    assert not programs.is_probing(program) and not programs.is_long(program)
    probe.end()
    assert programs.out == 0
