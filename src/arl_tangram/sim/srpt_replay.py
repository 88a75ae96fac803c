"""Sim: a clairvoyant preemptive shortest-remaining-first replay of single-core work on
``C`` identical cores (pure; exact, event-driven).

Why: a live run's "ideal" (every action as if alone, no queue) is not reachable when
actions arrive in bursts that need more cores than the pool has; the question a missed
ACT target raises is how close *any* practical scheduler of exclusive single-core grants
could come on the same arrivals. Preemptive SRPT with exact sizes known in advance is the
strongest such reference: on one core it minimises the mean flow time, and on ``C`` cores
it is the classical near-optimal rule (not provably optimal there, so this is a reference,
not a bound). Every job needs one core; a job may be paused and resumed on any core at no
cost (migration and preemption free), which only flatters the replay.

Rule: at every moment the ``C`` unfinished jobs with the least remaining work run (ties:
earlier arrival, then input order); the others wait. Events are arrivals and completions,
between which the running set does not change, so the replay is exact, in O(n² log n).
"""

from __future__ import annotations

from collections.abc import Sequence


def srpt_flow_times(arrivals_s: Sequence[float], sizes_s: Sequence[float], cores: int) -> list[float]:
    """Per job (input order), its completion minus its arrival under preemptive SRPT on
    ``cores`` identical cores. ``sizes_s`` are the jobs' run times on one core (>= 0)."""
    if len(arrivals_s) != len(sizes_s):
        raise ValueError(f"srpt_flow_times: {len(arrivals_s)} arrivals but {len(sizes_s)} sizes")
    if cores < 1:
        raise ValueError(f"srpt_flow_times: cores must be >= 1, got {cores}")
    if any(s < 0 for s in sizes_s):
        raise ValueError("srpt_flow_times: sizes must be >= 0")
    order = sorted(range(len(arrivals_s)), key=lambda i: (arrivals_s[i], i))
    left = [float(s) for s in sizes_s]
    flow = [0.0] * len(left)
    active: list[int] = []
    now, nxt = float("-inf"), 0  # arrivals may be negative (relative to a run's start)
    while nxt < len(order) or active:
        if not active:
            now = max(now, arrivals_s[order[nxt]])
        while nxt < len(order) and arrivals_s[order[nxt]] <= now:
            active.append(order[nxt])
            nxt += 1
        active.sort(key=lambda i: (left[i], arrivals_s[i], i))
        running = active[:cores]
        step = min(left[i] for i in running)
        if nxt < len(order):
            step = min(step, arrivals_s[order[nxt]] - now)
        now += step
        for i in running:
            left[i] -= step
        for i in [i for i in running if left[i] <= 1e-12]:
            flow[i] = now - arrivals_s[i]
            active.remove(i)
    return flow
