"""Core: the weighted fair share between tenants (RL jobs sharing one pool).

Every policy walks a lane's queue to pick its candidates. With one tenant in a lane the walk
is FCFS. With several, ``share_order`` interleaves them by start-time fair queuing on each
tenant's *use*: the moving average of the share units its running actions held (time
constant ``SHARE_TAU_S``), divided by its weight (``ClusterSpec.weight_of``). The walk always
continues with the tenant whose use is lowest (ties: the older action), and charges each
action it yields its cost at ``dop_min`` / weight, so one round interleaves too. Then:

- within a tenant, order stays FCFS (the elastic policy's rules hold inside a tenant);
- under contention a tenant that used less than its weighted share comes first, so the
  average holdings converge to the weights, even when a pool has only a few large slots
  (a moving average, not the instantaneous holding: with two 4-core slots and weights 3:1,
  instantaneous holdings can only alternate 1:1);
- the order only decides who comes first when not everything fits: a tenant with nothing
  queued takes nothing and the others use its share (lent, not lost: work conservation);
- a tenant that becomes active again starts at the lowest use among the active tenants of
  the lane (scaled to its weight), like CFS's ``min_vruntime``: an idle spell earns no credit
  to monopolise the pool later, and costs nothing either.

Share units per lane: millicores for the CPU lane (its key resource), one per running call
for service and API lanes (a call holds a replica or a quota slot for its duration).

Cost: with one tenant queued in a lane the walk is the lane itself. With several, the walk
reads the lane lazily, only as far as it needs to know each tenant's next action.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import QueuedAction, StateEditor, TenantUse

# How long a tenant's past use weighs in its share: a few RL actions' worth (assumption;
# shorter forgets bursts sooner, longer evens out coarse slots better).
SHARE_TAU_S = 30.0


def share_units(lane: str, grant: ResourceVector) -> int:
    """What one running action of ``lane`` holding ``grant`` counts against its tenant."""
    if lane == "queue_cpu":
        return grant.cpu_millicores
    return 1


def use_now(use: TenantUse, now_s: float) -> float:
    """``use.avg_units`` decayed towards ``use.held_units`` until ``now_s``."""
    elapsed = max(0.0, now_s - use.since_s)
    return use.held_units + (use.avg_units - use.held_units) * math.exp(-elapsed / SHARE_TAU_S)


def note_queued(ed: StateEditor, lane: str, tenant: str, delta: int) -> None:
    """Count an action of ``tenant`` into (+1) or out of (-1) ``lane``'s queue; a tenant
    that becomes active starts at the lane's lowest weighted use."""
    key = (lane, tenant)
    queued: dict[Any, int] = ed.w("tenant_queued")  # type: ignore[assignment]
    count = queued.get(key, 0) + delta
    if count:
        queued[key] = count
    else:
        queued.pop(key, None)
    if key not in ed.tenant_held and count > 0:
        _uses(ed)[key] = TenantUse(0, _lowest_use(ed, lane) * ed.spec.weight_of(tenant), ed.now_s)
    _forget_if_idle(ed, key)


def note_held(ed: StateEditor, lane: str, tenant: str, units: int) -> None:
    """Add (or, negative, return) ``units`` to what ``tenant``'s running actions hold."""
    if not units:
        return
    key = (lane, tenant)
    use = ed.tenant_held.get(key) or TenantUse(0, _lowest_use(ed, lane) * ed.spec.weight_of(tenant), ed.now_s)
    _uses(ed)[key] = TenantUse(use.held_units + units, use_now(use, ed.now_s), ed.now_s)
    _forget_if_idle(ed, key)


def _forget_if_idle(ed: StateEditor, key: tuple[str, str]) -> None:
    use = ed.tenant_held.get(key)
    if use is not None and not use.held_units and not ed.tenant_queued.get(key):
        del _uses(ed)[key]


def _uses(ed: StateEditor) -> dict[Any, TenantUse]:
    return ed.w("tenant_held")  # type: ignore[return-value]


def _lowest_use(ed: StateEditor, lane: str) -> float:
    """The lowest weighted use among the lane's active tenants (0 when none is active)."""
    uses = [use_now(u, ed.now_s) / ed.spec.weight_of(t) for (name, t), u in ed.tenant_held.items() if name == lane]
    return min(uses, default=0.0)


def queued_tenants(ed: StateEditor, lane: str) -> list[str]:
    """The tenants with at least one action queued in ``lane``, sorted."""
    return sorted(t for (lane_name, t), n in ed.tenant_queued.items() if lane_name == lane and n > 0)


def share_order(ed: StateEditor, lane: str) -> Iterable[QueuedAction]:
    """``lane``'s queued actions in fair-share order (FCFS when one tenant is queued).

    Lazy: a policy that stops after ``depth`` candidates reads no further. Callers must not
    change the lane while iterating (take a ``list`` first if they do).
    """
    table = getattr(ed, lane)
    tenants = queued_tenants(ed, lane)
    if len(tenants) < 2:
        return table.values()  # type: ignore[no-any-return]
    return _fair_walk(ed, lane, table.values(), tenants)


def _fair_walk(ed: StateEditor, lane: str, fcfs: Iterable[QueuedAction], tenants: list[str]) -> Iterator[QueuedAction]:
    weight = {t: ed.spec.weight_of(t) for t in tenants}
    virtual = {t: _use_of(ed, lane, t) / weight[t] for t in tenants}
    left = {t: ed.tenant_queued[(lane, t)] for t in tenants}  # queued but not yet read
    heads: dict[str, deque[QueuedAction]] = {t: deque() for t in tenants}
    stream = iter(fcfs)

    def fill(tenant: str) -> bool:
        """Read the lane until ``tenant`` has a buffered action; False if it has none left."""
        while not heads[tenant] and left[tenant] > 0:
            qa = next(stream, None)
            if qa is None:
                return False  # counts and lane disagree; the invariant check reports that
            owner = qa.spec.tenant
            if owner in heads:
                heads[owner].append(qa)
                left[owner] -= 1
        return bool(heads[tenant])

    ready = [(virtual[t], heads[t][0].seq, t) for t in tenants if fill(t)]
    heapq.heapify(ready)
    while ready:
        _, _, tenant = heapq.heappop(ready)
        qa = heads[tenant].popleft()
        yield qa
        cost = share_units(lane, qa.spec.demand_at(qa.spec.dop_min))
        virtual[tenant] += cost / weight[tenant]
        if fill(tenant):
            heapq.heappush(ready, (virtual[tenant], heads[tenant][0].seq, tenant))


def _use_of(ed: StateEditor, lane: str, tenant: str) -> float:
    use = ed.tenant_held.get((lane, tenant))
    return 0.0 if use is None else use_now(use, ed.now_s)
