"""Core: the order a CPU round walks its queue in: short actions first, without sizes given.

Why: under FCFS a read of 13 ms that arrives behind a crowd of 0.5-s memory spikes waits for
all of them (the live SWE workload: lint queued 1.7 s for 0.06 s of work on a saturated
2-core node). Each queued action gets a *due time*, its arrival plus ``slowdown`` times its
expected size (the client's ``t_ori_s``, else its kind's learned mean T_ori), and the walk
goes by due time: shortest-expected-first among actions that arrived together, and an
action that waited long enough comes before a short one that just arrived, so every size
keeps moving. A kind never seen yet is expected to be short (due at its arrival: a new
action starts at the top, as in a multi-level feedback queue) until its first run ends.

Two guarantees are kept from FCFS:
- an action queued ``aging_s`` or longer is due at its arrival, so the round's aging
  reservation (``cpu_round.collect``) still meets the oldest first and nothing starves;
- fair share between tenants: the walk keeps the tenants' interleaving (``share_order``)
  and reorders only within each tenant's own places in it.

Pure; the cost is one sort of the scanned window (at most ``scan_limit`` actions) per round.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable

from arl_tangram.core.state import QueuedAction, StateEditor


def expected_size_s(ed: StateEditor, qa: QueuedAction) -> float:
    """The client's T_ori, else the kind's learned mean, else 0 (never seen: assumed short)."""
    if qa.spec.t_ori_s is not None:
        return qa.spec.t_ori_s
    n_mean = ed.estimates.get(qa.spec.kind)
    return n_mean[1] if n_mean else 0.0


def by_due_time(ed: StateEditor, window: Iterable[QueuedAction], slowdown: float, aging_s: float) -> Iterable[QueuedAction]:
    """``window`` (fair-share order) reordered by due time within each tenant; ``slowdown``
    <= 0 returns it unchanged (FCFS)."""
    if slowdown <= 0:
        return window
    fair = list(window)
    if len(fair) < 2:
        return fair
    aged_before = ed.now_s - aging_s

    def due(qa: QueuedAction) -> tuple[float, int]:
        if qa.submitted_s <= aged_before:
            return (qa.submitted_s, qa.seq)  # aged: every un-aged due time is later, so FCFS ahead of them
        return (qa.submitted_s + slowdown * expected_size_s(ed, qa), qa.seq)

    tenants = [qa.spec.tenant for qa in fair]
    if len(set(tenants)) == 1:
        return sorted(fair, key=due)
    mine: dict[str, list[QueuedAction]] = defaultdict(list)
    for qa in fair:
        mine[qa.spec.tenant].append(qa)
    queues = {t: deque(sorted(qs, key=due)) for t, qs in mine.items()}
    return [queues[t].popleft() for t in tenants]
