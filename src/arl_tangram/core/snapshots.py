"""Core: snapshot and rollback as actions of the env they freeze, and the rule that orders
them against the env's other actions.

A snapshot (and a rollback, which restarts the env on a snapshot's layers) must never see
the env mid-write, and the env cannot run anything while its root is being swapped. So both
are *exclusive* actions of their env: one starts only when nothing else runs on its env, and
while one is queued or running no later action of that env starts (FCFS: it is not starved
by a stream of small actions behind it). A fork is a snapshot followed by child envs, each
an ``EnvSpec`` with ``snapshot`` and ``fork_of`` set, which placement puts on the parent's
node and charges like any env (memory held, so the node's capacity bounds a burst of forks).
"""

from __future__ import annotations

from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.env_spec import check_snapshot_id
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import StateEditor

#: the kinds that hold their env exclusively
EXCLUSIVE_KINDS = frozenset({"snapshot", "rollback"})
#: a snapshot copies the env's writable layer on the host: one core's worth while it runs
SNAPSHOT_DEMAND = ResourceVector(cpu_millicores=1000)
__all__ = ["EXCLUSIVE_KINDS", "blocked", "check_snapshot_id", "exclusive_action", "is_exclusive"]


def is_exclusive(spec: ActionSpec) -> bool:
    return spec.kind in EXCLUSIVE_KINDS and spec.binding.kind == "env"


def exclusive_action(action_id: str, kind: str, env_id: str, tenant: str, trajectory_id: str = "") -> ActionSpec:
    """The ``snapshot`` or ``rollback`` action of ``env_id``."""
    if kind not in EXCLUSIVE_KINDS:
        raise SpecError("kind", f"must be one of {sorted(EXCLUSIVE_KINDS)}", kind)
    return ActionSpec(action_id, kind, Binding("env", env_id), tenant, trajectory_id, demand_fixed=SNAPSHOT_DEMAND)


def blocked(ed: StateEditor, spec: ActionSpec, fenced: set[str]) -> bool:
    """Whether the env-bound ``spec`` must wait this round. Called in FCFS order over the
    queue with one ``fenced`` set per round: an exclusive action fences its env for every
    action behind it, and waits itself until its env runs nothing; any action waits while
    an exclusive one runs on its env."""
    env_id = spec.binding.name
    if env_id in fenced:
        return True
    busy = ed.env_busy.get(env_id, ())
    if is_exclusive(spec):
        fenced.add(env_id)
        return bool(busy)
    running = ed.running
    return any(a in running and is_exclusive(running[a].spec) for a in busy)
