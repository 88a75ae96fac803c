"""Shell: the order in which a pool bucket's waiting borrowers get an env (``CodeEnvPool``).

Four lines, each oldest first:
- ``retries``: borrowers retrying a call answered 504 (``compat.retries``), served first;
- ``waiters``: first attempts not known to run long;
- ``held``: first attempts whose program is known to run long (``compat.long_programs``),
  served after ``waiters``, or before them once due;
- ``probing``: first attempts whose program's probe is in flight; never served until it
  ends (``recheck``: back to the front of ``waiters``, or to ``held``), or until due.
A turn is due ``HOLD_MARGIN_S`` before its wait ends (its start-by time, by the client's
deadline), so holding back never turns into a 504 by itself. A waiter's ``long`` and
``probing`` are asked when it reaches the front of ``waiters`` (and by ``recheck``), so a
program seen long later still counts. Event-loop thread only; no lock.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: a held-back borrower is served ahead of the others once this little is left of its wait:
#: time for its env's hand-over and its step's start
HOLD_MARGIN_S = 1.5


@dataclass(eq=False)
class Turn:
    """A borrower waiting: ``future`` gets an env handed to it (or None: look again);
    ``long`` / ``probing`` (None: never held back) say where it waits; from ``due``
    (monotonic) on it is served first."""

    future: asyncio.Future[str | None]
    long: Callable[[], bool] | None = None
    probing: Callable[[], bool] | None = None
    due: float = math.inf

    def is_probing(self) -> bool:
        return self.probing is not None and self.probing()

    def is_long(self) -> bool:
        return self.long is not None and self.long()


@dataclass
class Lines:
    """A bucket's waiting borrowers (see the module docstring)."""

    retries: collections.deque[Turn] = field(default_factory=collections.deque)
    waiters: collections.deque[Turn] = field(default_factory=collections.deque)
    held: collections.deque[Turn] = field(default_factory=collections.deque)
    probing: collections.deque[Turn] = field(default_factory=collections.deque)

    def __bool__(self) -> bool:
        return bool(self.retries or self.waiters or self.held or self.probing)

    def add(self, turn: Turn, retry: bool = False) -> None:
        if retry:
            self.retries.append(turn)
        elif turn.is_probing():
            self.probing.append(turn)
        else:
            self.waiters.append(turn)

    def remove(self, turn: Turn) -> bool:
        """Take ``turn`` out of whichever line holds it; False if none does (it was served)."""
        for line in (self.retries, self.waiters, self.held, self.probing):
            if turn in line:
                line.remove(turn)
                return True
        return False

    def next_turn(self) -> Turn | None:
        """The turn to serve next, taken out of its line; None when none may be served now.
        Order: retries; a due held or probing turn; waiters (one found long moves to
        ``held``, one found probing to ``probing``); held. Done (cancelled) turns are dropped."""
        now = time.monotonic()
        for line in (self.retries, self.held, self.probing, self.waiters, self.held):
            while line:
                turn = line[0]
                if turn.future.done():
                    line.popleft()
                elif line is self.probing or (line is self.held and self.waiters):
                    if turn.due > now:
                        break  # not due: the waiters not known to run long go first
                    return line.popleft()
                elif line is self.waiters and turn.is_probing():
                    self.probing.append(line.popleft())
                elif line is self.waiters and turn.is_long():
                    self.held.append(line.popleft())
                else:
                    return line.popleft()
        return None

    def recheck(self) -> int:
        """Move the probing turns whose program's probe has ended back to the front of
        ``waiters`` (in their order: they came first); returns how many moved."""
        ready = [turn for turn in self.probing if turn.future.done() or not turn.is_probing()]
        for turn in reversed(ready):
            self.probing.remove(turn)
            if not turn.future.done():
                self.waiters.appendleft(turn)
        return len(ready)
