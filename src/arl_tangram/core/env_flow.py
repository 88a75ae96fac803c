"""Core: what the env actions' submissions teach about a pool's arrivals.

Envs are a closed loop: an env submits an action, waits for it, thinks, and submits again.
The opportunity cap (``policies/opportunity.py``) prices a core by the arrivals expected
while it is held. It reads them off the running actions; when no elastic action runs (the
first arrivals of a batch, a lull) there is nothing to read, and a test run arriving then
took every free core while the lints behind it queued. The flow learned here stands in:

- submissions per idle env-second (one idle env submits at this rate: 1 / its think time);
- the share of env submissions that are CPU-keyed (the cap's "elastic");
- the mean core-seconds a submission of any other kind asks for.

Kept as exponentially decayed sums (time constant ``FLOW_TAU_S``) in
``ClusterState.env_flow``: O(1) per round, no per-env table. An env counts as idle when it
is ready and has nothing running or queued; ``advance`` integrates that count over each
round's interval (it approximates "queued" by the CPU lane's length, which is env actions
but for the rare unbound ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind
from arl_tangram.core.state import StateEditor

FLOW_TAU_S = 60.0  # how fast the learned flow forgets: a minute of RL rollout (assumption)
MIN_SUBMISSIONS = 4.0  # decayed submissions seen before the flow is trusted
IDLE_ENV_S, SUBMISSIONS, ELASTIC, COMMAND_CORE_S = "idle_env_s", "submissions", "elastic", "command_core_s"


@dataclass(frozen=True)
class LearnedFlow:
    per_idle_env: float  # submissions per second of one idle env
    elastic_share: float
    command_core_s: float


def advance(ed: StateEditor, since_s: float) -> None:
    """Decay the sums over ``[since_s, ed.now_s]`` and add the idle env-seconds of that
    interval (the state as the last round left it). Called once per round, before its events."""
    dt = ed.now_s - since_s
    if dt <= 0.0 or not (ed.envs or ed.env_flow):
        return
    keep = math.exp(-dt / FLOW_TAU_S)
    idle = len(ed.envs) - len(ed.env_queue) - len(ed.env_busy) - len(ed.queue_cpu)
    flow = ed.w("env_flow")
    for key in (SUBMISSIONS, ELASTIC, COMMAND_CORE_S, IDLE_ENV_S):
        flow[key] = flow.get(key, 0.0) * keep
    flow[IDLE_ENV_S] += max(0, idle) * dt


def note_submitted(ed: StateEditor, spec: ActionSpec, t_ori_s: float) -> None:
    """Count one env-bound submission (``t_ori_s``: its estimated run on one unit)."""
    flow = ed.w("env_flow")
    flow[SUBMISSIONS] = flow.get(SUBMISSIONS, 0.0) + 1.0
    if spec.key is ResourceKind.CPU:
        flow[ELASTIC] = flow.get(ELASTIC, 0.0) + 1.0
    else:
        core_s = t_ori_s * spec.demand_min.cpu_millicores / MILLICORES_PER_CORE
        flow[COMMAND_CORE_S] = flow.get(COMMAND_CORE_S, 0.0) + core_s


def learned(ed: StateEditor) -> LearnedFlow | None:
    """The learned flow, or None before ``MIN_SUBMISSIONS`` or any idle time was seen."""
    flow = ed.env_flow
    submissions, idle_s = flow.get(SUBMISSIONS, 0.0), flow.get(IDLE_ENV_S, 0.0)
    if submissions < MIN_SUBMISSIONS or idle_s <= 0.0:
        return None
    elastic = flow.get(ELASTIC, 0.0)
    commands = submissions - elastic
    command_core_s = flow.get(COMMAND_CORE_S, 0.0) / commands if commands > 1e-9 else 0.0
    return LearnedFlow(submissions / idle_s, elastic / submissions, command_core_s)
