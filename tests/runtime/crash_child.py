"""A service process for the ``kill -9`` test (``python -m tests.runtime.crash_child
JOURNAL``): an embedded runtime with a journal, one action running on every core, one
queued on another env, one queued that needs no env. Once the running one is visibly
running (so its start is committed), it prints the accepted ids as one JSON line and waits
to be killed."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from arl_tangram.client import AsyncClient
from arl_tangram.client.transport import InProcessTransport
from arl_tangram.runtime.embedded import EmbeddedRuntime
from tests.runtime.builders import NOOP, config, exec_payload, exec_spec, noop_spec


async def main(journal_path: str) -> None:
    runtime = await EmbeddedRuntime.start(config(journal_path=journal_path))
    transport = InProcessTransport(runtime)
    tg = AsyncClient(transport)
    c = runtime.controller
    hog_env, other_env = await tg.create_env(memory="64MiB"), await tg.create_env(memory="64MiB")
    cores = sum(c.loop.state.spec.cpu_nodes[0].numa_cores)
    running = c.submit(exec_spec(hog_env.env_id, cores=cores), exec_payload("echo up > up.txt; sleep 300"), request_id="run")
    while True:  # the command runs only once its start is committed to the journal
        try:
            if await hog_env.read_file("up.txt"):
                break
        except Exception:
            pass
        await asyncio.sleep(0.05)
    queued_env = c.submit(exec_spec(other_env.env_id), exec_payload("sleep 300"), request_id="queued-env")
    queued_free = c.submit(noop_spec(cpu_millicores=1000), NOOP, request_id="queued-free")
    await c.flush_journal()
    ids = {"running": running.spec.action_id, "queued_env": queued_env.spec.action_id, "queued_free": queued_free.spec.action_id}
    print(json.dumps({"pid": os.getpid(), "ids": ids, "envs": [hog_env.env_id, other_env.env_id]}), flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
