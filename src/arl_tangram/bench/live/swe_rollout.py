"""Shell: one SWE rollout on an env that is set up (the same steps on every system), and
the records its actions leave.

A rollout: read the buggy module, grep the package, run a subset of the tests, profile its
memory (the spiky step), edit (the right or a wrong fix) and lint, run the whole suite
elastically (``$TANGRAM_DOP`` workers), then the reward: the hidden tests' verdict on the
final tree. A think (a sleep: no LLM runs) comes before each action. Who calls:
``swe._pod_rollout`` and ``swe._tangram_group`` once the env has the set-up state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from arl_tangram.bench.live.swe_plan import ACT_KINDS, RolloutPlan, SweConfig
from arl_tangram.bench.live.swe_repo import SweTask
from arl_tangram.client import Elastic
from arl_tangram.client.client import Env
from arl_tangram.runtime.actions import ActionResult

SETUP_MARKER = "/testbed/.setup-done"


@dataclass
class ActionRecord:
    """One action a rollout waited on, with its times relative to the system's start."""

    kind: str
    submitted_s: float
    result: ActionResult
    mem_bytes: int = 0  # the memory it declared (granted while it ran), where memory is per action
    footprint_bytes: int = 0  # its env's idle footprint right after it (held until the next action ends)

    @property
    def ended_s(self) -> float:
        return self.started_s + self.result.exec_s + self.result.overhead_s

    @property
    def started_s(self) -> float:
        return self.submitted_s + self.result.queue_s


@dataclass
class RolloutOutcome:
    plan: RolloutPlan
    started_s: float  # the rollout asked for its env (a pod), or its group for its set-up env
    env_ready_s: float = 0.0  # its env existed (a Pending pod waited until here)
    setup_s: float = 0.0  # its set-up time (tangram: the group's setup and fork over G)
    ended_s: float = 0.0
    actions: list[ActionRecord] = field(default_factory=list)
    setup: list[ActionRecord] = field(default_factory=list)  # set-up actions (out of ACT)
    marker_ok: bool = False  # the set-up step's file was there when the rollout began
    verdict: bool | None = None  # the hidden tests passed on the final tree
    oom_killed: int = 0
    lost: int = 0  # actions that ended other than succeeded/failed (oom_killed included)
    reserved_mem_bytes: int = 0  # what the env held for its life (0: per-action grants and footprints)
    reserved_millicores: int = 0  # what the pod held for its life (0: only per-action grants)

    @property
    def reward_intact(self) -> bool:
        return self.lost == 0 and self.verdict is not None and self.marker_ok

    @property
    def correct(self) -> bool:
        """The reward came back and says what the edit deserves."""
        return self.reward_intact and self.verdict == self.plan.right


@dataclass(frozen=True)
class RolloutContext:
    """What a system's rollouts share: the config, the pool's cores, one clock, and (tangram)
    how to read an env's idle footprint, which it holds between its actions."""

    system: str
    config: SweConfig
    pool_cores: int
    t0: float
    footprint_of: Callable[[str], int] | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def per_action_memory(self) -> bool:
        return self.system == "tangram"


async def act(
    ctx: RolloutContext, records: list[ActionRecord], env: Env, command: str, kind: str,
    cpu: Elastic | int = 1, memory_bytes: int | None = None,
) -> ActionResult:  # fmt: skip
    """One exec, recorded; ``memory_bytes`` is declared only where memory is per action
    (tangram), and then the env's footprint after it is recorded too."""
    kwargs: dict[str, Any] = {"cpu": cpu, "kind": kind, "timeout_s": ctx.config.action_timeout_s}
    declared = memory_bytes if memory_bytes is not None and ctx.per_action_memory else 0
    if declared:
        kwargs["memory"] = declared
    submitted_s = ctx.now()
    call: Awaitable[ActionResult] = env.exec(command, **kwargs)
    result = await call
    footprint = ctx.footprint_of(env.env_id) if ctx.footprint_of is not None else 0
    records.append(ActionRecord(kind, submitted_s, result, declared, footprint))
    return result


async def setup(ctx: RolloutContext, env: Env, records: list[ActionRecord]) -> ActionResult:
    """The set-up step: the repo's code generator and byte-compile (real CPU and memory)."""
    return await act(ctx, records, env, "python3 setup_dev.py", "setup", 1, ctx.config.setup_grant_bytes)


async def rollout(ctx: RolloutContext, env: Env, task: SweTask, out: RolloutOutcome, first_extra_queue_s: float = 0.0) -> None:
    """The rollout's turns on a set-up ``env``; its verdict and losses go into ``out``.
    ``first_extra_queue_s`` (the env's start-up: a Pending pod) counts as the first action's
    queue (PAPER: a Pending pod delays the trajectory's first action)."""
    cfg, think = ctx.config, dict(zip(ACT_KINDS, out.plan.think_s, strict=True))
    out.marker_ok = b'"digest"' in await env.read_file(SETUP_MARKER)
    grant, whole = cfg.action_grant_bytes, Elastic(1, ctx.pool_cores, serial_fraction=0.1)
    steps: list[tuple[str, str, Elastic | int, int]] = [
        ("read", "cat taskpkg/core.py", 1, grant),
        ("grep", "grep -rn 'def ' taskpkg tests", 1, grant),
        ("test_subset", "python3 run_tests.py -k fast", 1, grant),
        ("profile", f"python3 tools/profile_mem.py {cfg.spike_mib}", 1, cfg.spike_grant_bytes),
        ("lint", "python3 -m py_compile taskpkg/core.py", 1, grant),
        ("test", "python3 run_tests.py", whole, grant),
        ("reward", "python3 run_tests.py hidden_test.py", 1, grant),
    ]
    for kind, command, cpu, mem in steps:
        await asyncio.sleep(think[kind])  # the LLM writes the next action
        if kind == "lint":  # the edit: the rollout's patch of the buggy module
            await env.write_file("/testbed/taskpkg/core.py", task.fixed_core if out.plan.right else task.wrong_core)
        if kind == "reward":  # the harness drops the hidden tests into the final tree
            await env.write_file("/testbed/hidden_test.py", task.hidden_tests)
        r = await act(ctx, out.actions, env, command, kind, cpu, mem)
        if not out.actions[1:] and first_extra_queue_s:
            out.actions[0] = replace(out.actions[0], submitted_s=out.actions[0].submitted_s - first_extra_queue_s,
                                     result=replace(r, queue_s=r.queue_s + first_extra_queue_s))  # fmt: skip
        if r.outcome == "oom_killed":
            out.oom_killed += 1
        if r.outcome not in ("succeeded", "failed"):
            out.lost += 1
        elif kind == "reward":
            out.verdict = r.outcome == "succeeded"
    out.ended_s = ctx.now()
