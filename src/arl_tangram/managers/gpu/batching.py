"""Shell: micro-batching of concurrent runs of one replica, on the callers' threads.

The first caller of a replica opens a batch and becomes its leader; callers arriving within
``window_s`` (or until ``max_batch_size``) join it and wait. The leader runs the whole batch
once (``execute(items)`` returns one result or exception instance per item) and hands each
follower its own result. Everything happens on worker threads: the asyncio face submits to
a thread pool, so the event loop never waits on a batch, a tokenizer or a forward pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

ExecuteFn = Callable[[list[Any]], list[Any]]


@dataclass
class _Batch:
    items: list[Any] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    full: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class ThreadBatcher:
    """Batches ``submit`` calls per key; thread-safe; no thread of its own."""

    def __init__(self, window_s: float, max_batch_size: int) -> None:
        if window_s < 0 or max_batch_size < 1:
            raise ValueError("window_s must be >= 0 and max_batch_size >= 1")
        self.window_s = window_s
        self.max_batch_size = max_batch_size
        self._lock = threading.Lock()
        self._open: dict[Hashable, _Batch] = {}

    def submit(self, key: Hashable, item: Any, execute: ExecuteFn) -> Any:
        """Run ``item`` in a batch of ``key``; returns its result or raises its exception."""
        with self._lock:
            batch = self._open.get(key)
            leader = batch is None
            if batch is None:
                batch = self._open[key] = _Batch()
            index = len(batch.items)
            batch.items.append(item)
            if len(batch.items) >= self.max_batch_size:
                del self._open[key]  # later callers open the next batch
                batch.full.set()
        if leader:
            self._lead(key, batch, execute)
        else:
            batch.done.wait()  # the leader always sets it (finally below)
        result = batch.results[index]
        if isinstance(result, BaseException):
            raise result
        return result

    def _lead(self, key: Hashable, batch: _Batch, execute: ExecuteFn) -> None:
        try:
            if self.window_s > 0:
                batch.full.wait(self.window_s)
            with self._lock:
                if self._open.get(key) is batch:
                    del self._open[key]
            try:
                batch.results = list(execute(list(batch.items)))
            except BaseException as exc:  # the whole batch failed: every caller sees why
                batch.results = [exc] * len(batch.items)
            if len(batch.results) != len(batch.items):
                batch.results = [RuntimeError("batch returned a wrong number of results")] * len(
                    batch.items
                )
        finally:
            batch.done.set()
