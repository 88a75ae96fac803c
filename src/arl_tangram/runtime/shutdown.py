"""Shell: the first moment of a service's stop: everything not yet done gets its outcome now.

Who calls: ``Controller.begin_shutdown``, on the event-loop thread, once a server is told
to stop (SIGTERM), before the HTTP server's graceful wait and long before ``aclose``. Why
at once: a handler waiting for an env creation or a queued action would otherwise hold the
server's graceful shutdown (and the app's drain of its tasks) until the controller closes,
which only happens after them: the hang of a stop with the pool full. What it does:

- every pending env creation ends: its ``create_env`` raises ``EnvFailedError`` naming
  ``cause`` (the API answers 503), and the env is released (the core forgets it);
- every queued action (accepted, never started) ends ``error`` with ``cause``, journaled
  like any result, so every accepted action has a terminal result in the journal;
- every running action is stopped through the core's cancel path (it ends ``cancelled``:
  what ran, ran; its processes are gone).

Idempotent; the controller refuses submissions and env requests from then on.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from arl_tangram.core.events import ActionCancelled, Event
from arl_tangram.runtime.actions import ActionResult, ActionStore


class Creations(Protocol):
    """The executor's env creations in flight (``LiveExecutor`` has them)."""

    @property
    def env_waiters(self) -> dict[str, asyncio.Future[str | None]]: ...


class ShutdownHost(Protocol):
    """What ending pending work needs of the controller (``Controller`` is one)."""

    @property
    def executor(self) -> Creations | None: ...

    @property
    def store(self) -> ActionStore: ...

    def release_env(self, env_id: str) -> None: ...

    def post(self, event: Event) -> str: ...

SHUTTING_DOWN = "shutting_down"


def end_pending(controller: ShutdownHost, cause: str = SHUTTING_DOWN) -> tuple[int, int, int]:
    """(creations, queued, running) ended or stopped now."""
    executor = controller.executor
    creations = 0
    if executor is not None:
        for env_id, waiter in sorted(executor.env_waiters.items()):
            if not waiter.done():
                waiter.set_result(cause)  # create_env raises EnvFailedError(cause)
                creations += 1
            controller.release_env(env_id)
    queued = running = 0
    for action_id in controller.store.unfinished():
        record = controller.store.get(action_id)
        if record is None:
            continue
        if record.started_s is None:  # first wins: a StartAction still in the loop finds it ended
            controller.store.complete(action_id, ActionResult(action_id, record.spec.kind, "error", cause=cause))
            queued += 1
        else:
            running += 1
        # the core drops a queued one (its late reject changes nothing: first result wins)
        # and has the executor stop a running one
        controller.post(ActionCancelled(action_id))
    return creations, queued, running
