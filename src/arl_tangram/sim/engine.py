"""Sim: the virtual clock and event queue.

Entries fire in (time, sequence) order, so equal-time entries keep their insertion order
and a run is deterministic for a seed. An entry is a callback; callbacks may schedule
more entries and hand scheduler events to the current round.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(order=True)
class _Entry:
    time_s: float
    seq: int
    callback: Callable[[], None] = field(compare=False)


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._seq = 0
        self.now_s = 0.0

    def at(self, time_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at virtual ``time_s`` (never earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, _Entry(max(time_s, self.now_s), self._seq, callback))

    def after(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.at(self.now_s + delay_s, callback)

    def pop_due(self) -> list[Callable[[], None]]:
        """Advance the clock to the next entry time and return every callback due then."""
        if not self._heap:
            return []
        t = self._heap[0].time_s
        self.now_s = t
        due = []
        while self._heap and self._heap[0].time_s <= t:
            due.append(heapq.heappop(self._heap).callback)
        return due

    def __bool__(self) -> bool:
        return bool(self._heap)
