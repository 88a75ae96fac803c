"""Records of the live coding workload: what one trajectory did (its actions'
results, verdicts and scores) as the driver (``coding``) collects them and the report
(``coding_result``) reads them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from arl_tangram.bench.live.coding_plan import TrajectoryPlan
from arl_tangram.runtime.actions import ActionResult


@dataclass
class ActionRecord:
    """One action a trajectory waited on, with its times relative to the system's start."""

    category: str  # "env" (lint, test) or "reward"
    kind: str
    submitted_s: float
    result: ActionResult

    @property
    def act_s(self) -> float:
        return self.result.act_s


@dataclass
class TrajectoryOutcome:
    plan: TrajectoryPlan
    started_s: float
    ended_s: float = 0.0
    verdicts: list[tuple[str, bool]] = field(default_factory=list)  # (variant, passed)
    scores: list[tuple[str, float]] = field(default_factory=list)  # (variant, MiniLM score)
    actions: list[ActionRecord] = field(default_factory=list)
    lost: int = 0  # actions that ended other than succeeded/failed (none may)
    env_start_s: float = 0.0  # from asking for the env (a pod) to its sandbox being ready
    env_wait_s: float = 0.0  # of that, what outlasted the first think (the first action waited)

    @property
    def correct(self) -> bool:
        """Every test verdict matched the solution's known correctness, and nothing was lost."""
        return bool(self.verdicts) and self.lost == 0 and all(p == (v == "canonical") for v, p in self.verdicts)

    def with_env_wait(self) -> Iterator[tuple[ActionRecord, float]]:
        """Each action with the env start-up wait it carries: ``coding._action`` charged the
        first action ``env_wait_s`` as queue time and moved its submission back by it; 0 for
        the others."""
        for index, action in enumerate(self.actions):
            yield action, self.env_wait_s if index == 0 else 0.0
