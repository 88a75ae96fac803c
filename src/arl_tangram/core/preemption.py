"""Core: preemption and deadlines for single-core CPU actions (pure; no clock, no I/O).

Why: under exclusive grants a program that loops until its timeout holds a core for the
whole timeout while short programs queue behind it (issue 26: 48 looping runs of 3 s held
both cores of a 2-core node for 72 s). Two levels, a multi-level feedback queue without
sizes:
- level 0: a new action is granted cores exclusively, FCFS (the configured policy);
- level 1: a non-elastic CPU action (``dop_max == 1``) that has run its first quantum
  (``quantum_of``: twice its kind's T_ori, within [``QUANTUM_FLOOR_S``, ``quantum_s``]) while
  other CPU work waits on its node is *preempted* (``PreemptAction``): its cores go back to
  the pool at once and are re-granted to the waiting work, its memory stays granted, and
  the manager keeps it running at the floor CPU priority on all of the node's cpus. Demoted
  actions share between them whatever level 0 leaves idle (processor sharing among
  equals; the manager ages their weight), so a crowd of looping programs burns its
  wall-clock timeouts side by side instead of one core each in turn. Demoted actions hold
  no cores, so their number is not bounded by the node's: a new action starts at once by
  demoting an overdue one. Elastic actions keep their grants: their curve pays.
Victims: the overdue runs that started first (the most service attained, as a single-core
run's attained CPU is its running time): under the heavy tail of RL programs (a share loop
until their timeout) the longest-running is the likeliest to run longest still, so
demoting it costs the least expected wait (shortest-remaining-first without sizes).
A demotion's cost is its victim's share of the cores it leaves, so one is ordered only
for queued work that does not fit in the free cores, never to make room in advance.
Demotion never loses work and never changes a program's output or exit code; the only
priority it lowers is the CPU scheduler's.

Deadlines (``ActionSpec.deadline_s``): a queued action must start by
``submitted_s + deadline_s - timeout_s`` (its timeout, else its estimated duration), so
that even running to its limit it ends before its caller stops waiting; past that it ends
``rejected`` with a reason starting ``deadline:`` (retryable: the SandboxFusion face
answers 504, which verl retries). Candidates are otherwise served in the round's queue
order (short-first by due time, ``policies.short_first``; FCFS when it is off).
"""

from __future__ import annotations

from dataclasses import replace

from arl_tangram.core import ledger
from arl_tangram.core.decisions import Decision, PreemptAction
from arl_tangram.core.fair_share import note_held, share_units
from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import QueuedAction, Running, StateEditor, lane_of

PREEMPTED = "preempted"
QUANTUM_FLOOR_S = 0.02  # assumption: below ~a process start, a quantum would demote every run
QUANTUM_PER_T_ORI = 2.0  # a run past twice its kind's typical length is likely a long one
DEADLINE_PREFIX = "deadline:"


def is_preemptible(run: Running) -> bool:
    """A single-core CPU action on an env that still holds cores (not demoted yet)."""
    spec = run.spec
    return (
        spec.binding.kind == "env" and spec.dop_max == 1 and run.grant.cpu_millicores > 0
        and run.pause_cause == "" and run.replica_id is None
    )  # fmt: skip


def quantum_of(ed: StateEditor, run: Running, quantum_s: float) -> float:
    """A run's first quantum: ``QUANTUM_PER_T_ORI`` x its client or learned T_ori, clamped to
    [``QUANTUM_FLOOR_S``, ``quantum_s``]; ``quantum_s`` for a kind never seen. A run its client
    declares at least ``quantum_s`` long (known long: the SandboxFusion face declares a program
    seen looping) gets the floor: the cap would demote it anyway, and its exclusive time
    until then only delays the short runs waiting behind it."""
    if declared_long(run, quantum_s):
        return min(quantum_s, QUANTUM_FLOOR_S)
    t_ori = run.spec.t_ori_s
    if t_ori is None:
        n_mean = ed.estimates.get(run.spec.kind)
        t_ori = n_mean[1] if n_mean else None
    if t_ori is None:
        return quantum_s
    return min(quantum_s, max(QUANTUM_FLOOR_S, QUANTUM_PER_T_ORI * t_ori))


def declared_long(run: Running, quantum_s: float) -> bool:
    """Whether the run's client declared it at least ``quantum_s`` long (its T_ori)."""
    return run.spec.t_ori_s is not None and run.spec.t_ori_s >= quantum_s


def latest_start_s(ed: StateEditor, qa: QueuedAction) -> float | None:
    """When a queued action with a deadline must start at the latest (None: no deadline)."""
    spec = qa.spec
    if spec.deadline_s is None:
        return None
    need_s = spec.timeout_s if spec.timeout_s is not None else spec.duration_s(ledger.estimated_t_ori(ed, qa), spec.dop_min)
    return qa.submitted_s + spec.deadline_s - need_s


def any_deadline(ed: StateEditor) -> bool:
    """Whether a queued CPU action carries a deadline (``ClusterState.queued_deadlines``):
    both deadline passes below run every round, and when none does (the simulator's sweep)
    their loops over the queue were a tenth of a fixed-DoP round."""
    return ed.queued_deadlines > 0


def reject_late(ed: StateEditor, cause: str) -> list[Decision]:
    """End every queued CPU action that can no longer start in time (see the module doc)."""
    if not any_deadline(ed):
        return []
    late: list[tuple[str, float]] = []
    for aid, qa in ed.queue_cpu.items():
        at = latest_start_s(ed, qa)
        if at is not None and ed.now_s >= at:
            late.append((aid, at))
    decisions: list[Decision] = []
    for aid, at in late:
        qa = ed.queue_cpu[aid]
        why = (
            f"{DEADLINE_PREFIX} could not start by {at - qa.submitted_s:.3g} s after submission "
            f"(deadline_s {qa.spec.deadline_s:g} minus timeout_s); retry later"
        )
        decisions.append(ledger.reject(ed, aid, why, cause))
        ed.touch(None)
    return decisions


def next_deadline_s(ed: StateEditor) -> float | None:
    """The earliest latest-start of a queued CPU action still ahead (a wake-up for it)."""
    if not any_deadline(ed):
        return None
    ats = [at for qa in ed.queue_cpu.values() if (at := latest_start_s(ed, qa)) is not None and at > ed.now_s]
    return min(ats) if ats else None


def _waiting_millicores(ed: StateEditor) -> dict[str, int]:
    """Per node, the millicores queued env actions ask for at their least (their env's node)."""
    want: dict[str, int] = {}
    for qa in ed.queue_cpu.values():
        if qa.spec.binding.kind != "env":
            continue
        env = ed.envs.get(qa.spec.binding.name)
        if env is None or env.node_id is None or not env.ready:
            continue
        want[env.node_id] = want.get(env.node_id, 0) + qa.spec.demand_min.cpu_millicores
    return want


def preempt_overdue(ed: StateEditor, cause: str, quantum_s: float) -> list[Decision]:
    """Demote, oldest start first, the overdue preemptible actions of each node where queued
    work does not fit in the free cores, until it would (or none is left)."""
    want = _waiting_millicores(ed)
    decisions: list[Decision] = []
    for node_id in sorted(want):
        free = ed.cpu.get(node_id)
        short = want[node_id] - (free.free_millicores if free is not None else 0)
        if short <= 0:
            continue
        quanta = ((r, quantum_of(ed, r, quantum_s)) for r in ed.running.values() if r.node_id == node_id and is_preemptible(r))
        overdue = sorted(((r, q) for r, q in quanta if ed.now_s - r.started_s >= q), key=lambda rq: (rq[0].started_s, rq[0].seq))
        for run, quantum in overdue:
            if short <= 0:
                break
            short -= run.grant.cpu_millicores
            why = f"ran {ed.now_s - run.started_s:.3g} s >= quantum {quantum:.3g} s while work waits"
            decisions.append(preempt(ed, run, why, cause, declared_long(run, quantum_s)))
    return decisions


def preempt(ed: StateEditor, run: Running, reason: str, cause: str, known_long: bool = False) -> PreemptAction:
    """Give a running action's cores back to its node (its memory stays) and order it demoted."""
    cores = ResourceVector(cpu_millicores=run.grant.cpu_millicores)
    ed.give_cpu(run.node_id, cores, run.numa_millicores)
    lane = lane_of(run.spec.binding.kind)
    note_held(ed, lane, run.spec.tenant, -share_units(lane, cores))
    kept = run.grant - cores
    ed.w("running")[run.spec.action_id] = replace(
        run, grant=kept, numa_millicores=(), paused_since_s=ed.now_s, pause_cause=PREEMPTED
    )
    ed.touch(run.node_id)
    return PreemptAction(run.spec.action_id, run.node_id, reason, cause, known_long=known_long)


def next_quantum_s(ed: StateEditor, quantum_s: float) -> float | None:
    """When the next preemptible action on a node with waiting work reaches its quantum."""
    want = _waiting_millicores(ed)
    ends = (r.started_s + quantum_of(ed, r, quantum_s) for r in ed.running.values() if r.node_id in want and is_preemptible(r))
    ats = [at for at in ends if at > ed.now_s]
    return min(ats) if ats else None
