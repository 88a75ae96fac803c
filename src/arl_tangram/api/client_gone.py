"""Shell: waiting on work for a client that may go away.

A client is *gone* when its HTTP connection closed before the reply (issue 27's rule): the
env creation or the queued action it was waiting for is then cancelled by the route, not
left to hold the pool until a lease or a timeout ends it. ASGI tells a handler of a closed
connection only through ``receive``; Starlette's ``Request.is_disconnected`` reads it
without blocking, so the wait polls it every ``POLL_S`` beside the task.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

POLL_S = 0.25  # how soon a closed connection is noticed; one non-blocking receive per poll


async def wait_unless_gone(request: Request, task: asyncio.Future[Any], timeout_s: float | None) -> bool:
    """Wait for ``task`` up to ``timeout_s`` (None: unbounded); False as soon as the client
    is gone, also when the task ended in the same moment (the task is left as it is: the
    caller cancels or releases what it stands for), else True (``task`` done, or the
    timeout reached: read ``task.done()``)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while not task.done():
        step = POLL_S if deadline is None else min(POLL_S, deadline - loop.time())
        if step <= 0:
            return True
        await asyncio.wait((task,), timeout=step)
        if not task.done() and await request.is_disconnected():
            return False
    return not await request.is_disconnected()  # done just as it left: still made for no one
