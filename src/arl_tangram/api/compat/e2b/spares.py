"""Shell: ready envs kept for the E2B face's creates (``[e2b] warm`` per kind), so that
``Sandbox.create`` takes a started sandbox instead of waiting for one to start.

A kind is (tenant, image, memory): a spare is a normal env of that tenant, created by the
controller like any other (placed, pulled, leased), its id already the sandbox id it will
be given. Kinds are learned from creates: after a create of a kind, spares of that kind are
made in the background until ``warm`` are ready (none before a tenant ever asked: an idle
server holds nothing). A spare costs its memory while it waits. A spare whose env is gone
(released, its node lost) is skipped. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from arl_tangram.api.state import ApiState
from arl_tangram.core.action import EnvSpec

Kind = tuple[str, str, int]  # tenant, image, mem_bytes
log = logging.getLogger(__name__)


class Spares:
    def __init__(self, api: ApiState, warm: int, new_id: Any) -> None:
        self.api, self.warm, self.new_id = api, warm, new_id
        self.ready: dict[Kind, list[tuple[str, str]]] = {}  # kind -> (sandbox id, internal env id)
        self.filling: dict[Kind, int] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def take(self, kind: Kind) -> tuple[str, str] | None:
        """A ready spare of ``kind`` (sandbox id, internal env id), or None."""
        ready = self.ready.get(kind, [])
        while ready:
            sandbox_id, internal = ready.pop(0)
            if internal in self.api.controller.env_specs:
                return sandbox_id, internal
        return None

    def refill(self, kind: Kind) -> None:
        """Start making spares of ``kind`` until ``warm`` are ready or being made."""
        while not self.closed and len(self.ready.get(kind, [])) + self.filling.get(kind, 0) < self.warm:
            self.filling[kind] = self.filling.get(kind, 0) + 1
            task = asyncio.get_running_loop().create_task(self._make(kind))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _make(self, kind: Kind) -> None:
        tenant, image, mem_bytes = kind
        sandbox_id = self.new_id()
        internal = self.api.scoped(tenant, sandbox_id)
        try:
            await asyncio.wait_for(self.api.controller.create_env(EnvSpec(internal, mem_bytes, tenant, "", image=image)), self.api.create_timeout_s)
            if self.closed:
                self.api.controller.release_env(internal)
            else:
                self.ready.setdefault(kind, []).append((sandbox_id, internal))
        except Exception as exc:  # noqa: BLE001 - a spare that failed is only a create that will not be fast
            log.info("e2b spare of %s not made: %s", image, exc)
            if internal in self.api.controller.env_specs:
                self.api.controller.release_env(internal)
        finally:
            self.filling[kind] -= 1

    def renew(self) -> None:
        for spares in self.ready.values():
            for _, internal in spares:
                if internal in self.api.controller.env_specs:
                    self.api.controller.renew_env(internal)

    async def aclose(self) -> None:
        """Stop making spares and release the ready ones. Idempotent."""
        self.closed = True
        if self.tasks:  # a creation in flight releases its env itself once it sees closed
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self.tasks), timeout=self.api.create_timeout_s)
        for spares in self.ready.values():
            while spares:
                _, internal = spares.pop()
                if internal in self.api.controller.env_specs:
                    self.api.controller.release_env(internal)
