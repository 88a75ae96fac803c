"""What a run helper needs of the executor that calls it: a way to run a blocking manager
call on a worker thread (``LiveExecutor.blocking`` is one), so ``runs`` and ``snapshots``
never import the dispatcher that imports them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class BlockingRunner(Protocol):
    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread; the event loop never waits on it."""
        ...
