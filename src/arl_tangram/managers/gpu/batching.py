"""Shell: micro-batching of concurrent requests to one service (asyncio side).

The first request to a service opens a batch and starts one tracked task for it; requests
arriving within ``window_s`` (or until ``max_batch_size``) join the same batch. The task
runs the batch in the manager's worker pool (torch releases the GIL, the event loop stays
free) and resolves every caller's future with its own result, in order. No request is
lost: a caller that is cancelled only stops waiting; its request still runs with the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

ExecuteFn = Callable[[str, list[Any]], list[Any]]


@dataclass
class _Batch:
    items: list[Any] = field(default_factory=list)
    futures: list[asyncio.Future[Any]] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)


class MicroBatcher:
    """Batches ``submit`` calls per service; ``execute(service, items)`` returns one result
    (or exception instance) per item and runs in ``executor``."""

    def __init__(
        self, execute: ExecuteFn, executor: Executor, window_s: float, max_batch_size: int
    ) -> None:
        if window_s < 0 or max_batch_size < 1:
            raise ValueError("window_s must be >= 0 and max_batch_size >= 1")
        self._execute = execute
        self._executor = executor
        self.window_s = window_s
        self.max_batch_size = max_batch_size
        self._open: dict[tuple[str, int], _Batch] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, service: str, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        key = (service, id(loop))
        future: asyncio.Future[Any] = loop.create_future()
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = _Batch()
            task = loop.create_task(self._run(key, batch), name=f"arl-tangram-batch-{service}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.items.append(item)
        batch.futures.append(future)
        if len(batch.items) >= self.max_batch_size:
            self._open.pop(key, None)  # later requests open the next batch
            batch.full.set()
        return await future

    async def _run(self, key: tuple[str, int], batch: _Batch) -> None:
        if self.window_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(batch.full.wait(), self.window_s)
        if self._open.get(key) is batch:
            del self._open[key]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                self._executor, self._execute, key[0], list(batch.items)
            )
        except BaseException as exc:  # the whole batch failed (closed manager, busy device, ...)
            for future in batch.futures:
                if not future.done():
                    future.set_exception(
                        exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
                    )
            if not isinstance(exc, Exception):
                raise
            return
        for future, result in zip(batch.futures, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def drain(self) -> None:
        """Wait for every batch task started from the running loop."""
        loop = asyncio.get_running_loop()
        mine = [t for t in self._tasks if t.get_loop() is loop]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)
