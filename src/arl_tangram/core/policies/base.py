"""Core: the policy interface every scheduling policy implements."""

from __future__ import annotations

import abc

from arl_tangram.core.decisions import Decision
from arl_tangram.core.state import StateEditor


class Policy(abc.ABC):
    """A scheduling policy. Called by ``Scheduler`` only; changes state through ``ledger``.

    ``bootstrap`` runs once on an empty cluster (static deployments); ``schedule`` runs every
    round after the round's events are applied; ``wake_at`` says when the next round is
    needed even if no event arrives (aging deadlines, quota refills), or None.
    """

    name = "policy"

    def bootstrap(self, ed: StateEditor) -> list[Decision]:
        return []

    @abc.abstractmethod
    def schedule(self, ed: StateEditor, cause: str) -> list[Decision]:
        """Decisions for this round; changes ``ed`` only through ``ledger``."""

    def wake_at(self, ed: StateEditor) -> float | None:
        return None
