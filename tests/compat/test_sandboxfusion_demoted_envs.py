"""The code pool lends one more sandbox per run the core has demoted (issue 26): looping
programs that the core preempted hold no cores, so they must not hold every sandbox of the
bucket while a short program waits for one. Counted against ``max_envs``, the short program
below would wait for the first looping run's timeout (4 s); lent an extra sandbox, it runs
as soon as the core demotes a looping run (its first quantum, 0.1 s)."""

from __future__ import annotations

import asyncio
import os
import time

import httpx

from arl_tangram.runtime.config import SchedulerConfig, TangramConfig
from tests.compat.conftest import needs_sandbox_host, serve_compat

LOOP = {"code": "while True:\n    pass\n", "run_timeout": 4, "language": "python"}
SHORT = {"code": "print(6 * 7)\n", "run_timeout": 4, "language": "python"}


def test_a_short_run_does_not_wait_for_an_env_held_by_demoted_runs() -> None:
    needs_sandbox_host()
    loopers = (os.cpu_count() or 1) + 1  # one more than the cores: the core demotes one
    config = TangramConfig(scheduler=SchedulerConfig("elastic", {"preempt_quantum_s": 0.1}))  # type: ignore[arg-type]
    with serve_compat(config, max_envs=loopers, max_idle=loopers) as s:

        async def scenario() -> tuple[list[httpx.Response], httpx.Response, float]:
            async with httpx.AsyncClient(timeout=30) as client:
                looping = [asyncio.create_task(client.post(f"{s.url}/run_code", json=LOOP)) for _ in range(loopers)]
                await asyncio.sleep(1.0)  # every looping run started; one is demoted
                t0 = time.monotonic()
                short = await client.post(f"{s.url}/run_code", json=SHORT)
                waited_s = time.monotonic() - t0
                return await asyncio.gather(*looping), short, waited_s

        looped, short, waited_s = asyncio.run(scenario())
    assert short.status_code == 200 and short.json()["run_result"]["stdout"] == "42\n"
    assert all(r.status_code == 200 and r.json()["run_result"]["status"] == "TimeLimitExceeded" for r in looped)
    # without the extra sandbox it would wait ~3 s more for the first looping run's end
    assert waited_s < 2.5, f"the short run took {waited_s:.2f} s: it waited for a sandbox held by a demoted run"
