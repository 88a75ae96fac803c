"""Shell: waiting on work for a client that may go away.

A client is *gone* when its HTTP connection closed before the reply (issue 27's rule): the
env creation or the queued action it was waiting for is then cancelled by the route, not
left to hold the pool until a lease or a timeout ends it. ASGI tells a handler of a closed
connection only through ``receive``: once the body has been read, the server's next
``receive`` returns ``http.disconnect`` when the connection closes. So the wait parks one
such ``receive`` beside the task; nothing runs until one of the two ends. (It used to poll
``Request.is_disconnected`` every 0.25 s per request: with 768 verl requests waiting at
once, a quarter of the event loop's time went to those polls, issue 26.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request


async def wait_unless_gone(request: Request, task: asyncio.Future[Any], timeout_s: float | None) -> bool:
    """Wait for ``task`` up to ``timeout_s`` (None: unbounded); False as soon as the client
    is gone, also when the task ended in the same moment (the task is left as it is: the
    caller cancels or releases what it stands for), else True (``task`` done, or the
    timeout reached: read ``task.done()``). The request's body must have been read."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not gone.done():
            gone.cancel()
    return not (gone.done() and not gone.cancelled())


async def _disconnected(request: Request) -> None:
    """Returns when the client's connection closed (a body message arriving now, from a
    client still sending, is dropped: the handler has its body already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
