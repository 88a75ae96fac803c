"""``wait_unless_gone``: a route's wait on its work, ended early by a client that went away."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from arl_tangram.api.client_gone import wait_unless_gone

pytestmark = pytest.mark.anyio


def _request() -> tuple[Request, asyncio.Event, list[int]]:
    """A request whose connection closes when the event is set; the list counts receives."""
    closed, calls = asyncio.Event(), [0]

    async def receive() -> dict[str, str]:
        calls[0] += 1
        await closed.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive), closed, calls


async def test_a_waiting_request_costs_one_parked_receive_not_a_poll() -> None:
    """Hundreds of verl requests wait at once under load: each must cost the event loop
    nothing while it waits (a poll every 0.25 s each took a quarter of the loop, issue 26),
    and a close must still end the wait at once."""
    request, closed, calls = _request()
    work = asyncio.ensure_future(asyncio.sleep(30))
    waiting = asyncio.ensure_future(wait_unless_gone(request, work, None))
    await asyncio.sleep(1.0)
    assert calls[0] == 1 and not waiting.done()
    closed.set()
    assert await asyncio.wait_for(waiting, 1.0) is False
    assert not work.done()  # left to the caller to cancel
    work.cancel()


async def test_work_done_or_time_up_with_the_client_still_there_is_true() -> None:
    request, _closed, _calls = _request()
    done = asyncio.ensure_future(asyncio.sleep(0))
    assert await wait_unless_gone(request, done, None) is True
    slow = asyncio.ensure_future(asyncio.sleep(30))
    assert await wait_unless_gone(request, slow, 0.1) is True and not slow.done()
    slow.cancel()
