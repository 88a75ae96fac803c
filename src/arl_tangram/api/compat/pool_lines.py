"""Shell: the order in which a pool bucket's waiting borrowers get an env (``CodeEnvPool``).

Four lines, each oldest first:
- ``retries``: borrowers retrying a call answered 504 (``compat.retries``), served first,
  those not known to run long before those known long (a long run's env is held for its
  whole timeout: short retries behind a crowd of them waited 6-10 s, measured);
- ``waiters``: first attempts not known to run long;
- ``held``: first attempts whose program is known to run long (``compat.long_programs``),
  served after ``waiters``, or before them once due unless the front waiter or probing
  turn is due too;
- ``probing``: first attempts whose program's probe is in flight; never served until it
  ends (``recheck``: back to the front of ``waiters``, or to ``held``), or until due.
A turn is due ``HOLD_MARGIN_S`` before its wait ends (its start-by time, by the client's
deadline), so holding back does not turn into a 504 by itself while there is room. When
there is not (a due held turn and a due waiter or probing turn, one env), the latter goes
first: the long run would hold the env for its whole timeout, and what this costs is one
504 for the long call, whose retry is served before every first attempt (``retries``).
(``bench verdicts`` 256-half-loop: the held siblings of the looping programs, all due at
once, took every env while short calls were due too; those were answered 504.) A waiter's
``long`` and ``probing`` are asked when it reaches the front of ``waiters`` (and by ``recheck``), so a
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
    ``long`` / ``probing`` (None: never held back) say where it waits (a retry's ``long``
    only orders it among the retries); from ``due`` (monotonic) on it is served first."""

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
        Order: retries (``_next_retry``); a due held (``_unknown_due``) or probing turn;
        waiters (one found long moves to ``held``, one found probing to ``probing``); held. Done (cancelled) turns are dropped."""
        retry = self._next_retry()
        if retry is not None:
            return retry
        now = time.monotonic()
        for line in (self.held, self.probing, self.waiters, self.held):
            while line:
                turn = line[0]
                if turn.future.done():
                    line.popleft()
                elif line is self.probing or (line is self.held and self.waiters):
                    if turn.due > now or (line is self.held and self._unknown_due(now)):
                        break  # not due, or a turn not known to run long is due too: it goes first
                    return line.popleft()
                elif line is self.waiters and turn.is_probing():
                    self.probing.append(line.popleft())
                elif line is self.waiters and turn.is_long():
                    self.held.append(line.popleft())
                else:
                    return line.popleft()
        return None

    def _next_retry(self) -> Turn | None:
        """The oldest retry not known to run long, else the oldest retry, taken out of the
        line (done ones dropped); None when no retry waits."""
        while self.retries and self.retries[0].future.done():
            self.retries.popleft()
        for turn in self.retries:
            if not turn.future.done() and not turn.is_long():
                self.retries.remove(turn)
                return turn
        return self.retries.popleft() if self.retries else None

    def _unknown_due(self, now: float) -> bool:
        """Whether the oldest waiter or probing turn is due (its start-by time is near)."""
        fronts = (line[0] for line in (self.waiters, self.probing) if line)
        return any(not turn.future.done() and turn.due <= now for turn in fronts)

    def recheck(self) -> int:
        """Move the probing turns whose program's probe has ended back to the front of
        ``waiters`` (in their order: they came first); returns how many moved."""
        ready = [turn for turn in self.probing if turn.future.done() or not turn.is_probing()]
        for turn in reversed(ready):
            self.probing.remove(turn)
            if not turn.future.done():
                self.waiters.appendleft(turn)
        return len(ready)
