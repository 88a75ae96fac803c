"""Core: one CPU scheduling round: candidates in queue order (short-first by due time, or
FCFS), per-node pools, allocation, eviction.

Shared by the elastic policy (water-filling + greedy eviction) and the fixed-DoP ablation
(every elastic action gets exactly k units, no eviction).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice

from arl_tangram.core import ledger, memory, packing, snapshots
from arl_tangram.core.action import ActionSpec
from arl_tangram.core.decisions import Decision
from arl_tangram.core.elasticity import ElasticityModel, NonElastic
from arl_tangram.core.fair_share import share_order
from arl_tangram.core.policies import short_first
from arl_tangram.core.policies.eviction import plan_pool
from arl_tangram.core.policies.opportunity import knee
from arl_tangram.core.policies.waterfill import Claim
from arl_tangram.core.resources import ResourceKind
from arl_tangram.core.state import EnvState, QueuedAction, StateEditor


@dataclass
class Pools:
    """Candidates per node (in the walk's order) and the backlog of queued actions that did not fit."""

    candidates: dict[str, list[QueuedAction]] = field(default_factory=lambda: defaultdict(list))
    backlog: dict[str, list[QueuedAction]] = field(default_factory=lambda: defaultdict(list))
    oldest_blocked_s: float | None = None
    mem: dict[str, int] = field(default_factory=dict)  # candidate -> its memory grant (core.memory)


def is_cpu_action(qa: QueuedAction) -> bool:
    return qa.spec.binding.kind in ("env", "none")


def _node_for(ed: StateEditor, qa: QueuedAction, free: dict[str, list[int]], need_mc: int, need_mem: int) -> str | None:
    """The node with the most free cores that fits an action bound to no env."""
    best = None
    for node_id in sorted(free):
        f = free[node_id]
        if f[0] >= need_mc and f[1] >= need_mem and (best is None or f[0] > free[best][0]):
            best = node_id
    return best


def collect(
    ed: StateEditor, depth: int, aging_s: float, dop_of: Callable[[QueuedAction], int], scan_limit: int = 1024,
    mem_reserve_bytes: int = 0, slowdown: float = 0.0, pack: bool = False,
) -> Pools:  # fmt: skip
    """Walk the queue (FCFS, or by due time when ``slowdown`` > 0: ``short_first``) and take
    up to ``depth`` CPU candidates that fit at ``dop_of(qa)``.

    Skipping an action that does not fit lets smaller ones backfill, but once the head of a
    node's line has waited ``aging_s`` the node is reserved for it: no later action starts
    there until it has, so nothing starves. At most ``scan_limit`` CPU actions are looked
    at per round, which bounds a round's cost however long the queue grows. An action on
    an env charged per action (``core.memory``) also needs its memory grant, beside the
    node's ``mem_reserve_bytes`` and what paused actions wait for, and room under its
    env's limit. ``pack``: a single-core env action needs only its packing charge
    (``core.packing``).
    """
    pools = Pools()
    free = {n: [f.free_millicores, memory.admissible_bytes(ed, n, mem_reserve_bytes)] for n, f in ed.cpu.items()}
    env_room: dict[str, int] = {}
    idle_room: dict[str, int] = {}  # filled on first use (_idle_room): many rounds never need it
    reserved: set[str] = set()
    taken = 0
    envs, touched, every_node = ed.envs, ed.touched, "*" in ed.touched
    fenced: set[str] = set()  # envs an exclusive action (snapshot, rollback) holds this round
    # the hot loop of a round: kept lean on purpose (plain ints, no vectors built per action)
    hot = None if every_node else _envs_on(ed, touched)
    for qa in short_first.by_due_time(ed, islice(share_order(ed, "queue_cpu"), scan_limit), slowdown, aging_s):
        spec = qa.spec
        if hot is not None and spec.binding.name not in hot and spec.binding.kind == "env":
            continue  # its env is gone or on a node nothing touched: the checks below would say so
        base = None
        if spec.binding.kind == "env":
            env = envs.get(spec.binding.name)
            if env is None:
                continue
            node_id: str | None = env.node_id
            if not every_node and node_id not in touched:
                continue  # its node's plan from an earlier round stands (its env's fence is moot)
            if not env.ready or node_id not in free:
                continue  # its env is not ready yet
            if snapshots.blocked(ed, spec, fenced):
                continue  # a snapshot or rollback of its env goes first, alone
            base = spec.demand_at(dop_of(qa))
            need_mc, need_mem = base.cpu_millicores, base.mem_bytes
            charge = packing.charge_mc(ed, spec) if pack else None
            if charge is not None:
                need_mc = charge
            if env.per_action_memory:
                if not idle_room:
                    idle_room = _idle_room(ed, mem_reserve_bytes)
                mem = _env_grant(ed, env, spec, env_room, idle_room[node_id])
                if mem is None:
                    continue  # a known demand its env's other actions leave no room for: it waits
                need_mem += mem
        else:
            base = spec.demand_at(dop_of(qa))
            need_mc, need_mem = base.cpu_millicores, base.mem_bytes
            node_id = _node_for(ed, qa, free, need_mc, need_mem)
            if node_id is None:
                continue
        assert node_id is not None
        f = free[node_id]
        fits = f[0] >= need_mc and f[1] >= need_mem
        if fits and node_id not in reserved and taken < depth:
            f[0] -= need_mc
            f[1] -= need_mem
            if spec.binding.name in env_room:
                mem_grant = need_mem - base.mem_bytes
                env_room[spec.binding.name] -= mem_grant
                pools.mem[spec.action_id] = mem_grant
            pools.candidates[node_id].append(qa)
            taken += 1
            continue
        if len(pools.backlog[node_id]) < depth:
            pools.backlog[node_id].append(qa)
        if not fits and ed.now_s - qa.submitted_s >= aging_s:
            reserved.add(node_id)
        if pools.oldest_blocked_s is None:
            pools.oldest_blocked_s = qa.submitted_s
    return pools


_ENVS_BY_NODE_MEMO: list[object] = [None, None]  # (a frozen envs table, its env ids per node)


def _envs_on(ed: StateEditor, nodes: set[str]) -> set[str]:
    """The ids of the envs placed on ``nodes``: a round's queue walk skips the others by
    one set lookup. The per-node index is memoised on the envs table of the round's base
    state, as ``opportunity.ready_envs_per_node`` is, for the same reasons: an unwritten
    table is a past state's and immutable, the memo holds it (its id cannot be reused), and
    a table written this round is indexed afresh and not kept (most rounds write none)."""
    envs = ed.envs
    if _ENVS_BY_NODE_MEMO[0] is envs:
        by_node: dict[str | None, set[str]] = _ENVS_BY_NODE_MEMO[1]  # type: ignore[assignment]
    else:
        by_node = defaultdict(set)
        for env_id, env in envs.items():
            by_node[env.node_id].add(env_id)
        by_node = dict(by_node)
        if "envs" not in ed._copied:  # noqa: SLF001 -- the base table is immutable, see above
            _ENVS_BY_NODE_MEMO[0], _ENVS_BY_NODE_MEMO[1] = envs, by_node
    hot: set[str] = set()
    for node_id in nodes:
        hot |= by_node.get(node_id, set())
    return hot


def _idle_room(ed: StateEditor, mem_reserve_bytes: int) -> dict[str, int]:
    """What each node could grant one action once nothing else runs there: no grant is
    larger, so every action fits some day (a demand above it pauses and grows, or is ended)."""
    idle_room = {n: f.free_mem_bytes - mem_reserve_bytes for n, f in ed.cpu.items()}
    for run in ed.running.values():
        if run.node_id in idle_room:
            idle_room[run.node_id] += run.grant.mem_bytes
    return idle_room


def _env_grant(ed: StateEditor, env: EnvState, spec: ActionSpec, env_room: dict[str, int], idle_room: int) -> int | None:
    """The memory grant of an action on an env charged per action (``core.memory``), within
    what its node could ever grant (``idle_room``) and what its env's limit leaves beside
    the actions already taken this round (``env_room``, filled per env on first use); None
    when its demand is known and does not fit there: it waits."""
    room = env_room.get(env.spec.env_id)
    if room is None:
        room = env_room[env.spec.env_id] = memory.env_headroom(ed, env)
    mem = min(memory.action_grant(ed, env, spec.memory_bytes, spec.kind), max(0, idle_room))
    if mem > room and (spec.memory_bytes is not None or memory.learned_peak(ed, spec.kind) is not None):
        return None
    return min(mem, max(0, room))  # no known demand: it shares what the env's limit leaves


def claim_of(ed: StateEditor, qa: QueuedAction, fixed_dop: int | None = None, cap: int | None = None, pack: bool = False) -> Claim:
    """The allocation view of a CPU candidate.

    A CPU-elastic action claims cores per unit of DoP (its fixed part is charged by the
    caller), at most ``cap`` units when the pool prices its cores (``opportunity.fair_caps``),
    but never fewer than its declared curve's efficiency knee (``opportunity.knee``) nor its
    minimum. Any other action is one indivisible unit costing its whole CPU demand.
    ``pack``: a single-core env action costs its packing charge (``core.packing``).
    """
    spec = qa.spec
    charge = packing.charge_mc(ed, spec) if pack else None
    if charge is not None:
        # its fixed part (a CPU-keyed spec's) is charged by the caller, as for any claim
        fixed = spec.demand_fixed.cpu_millicores if spec.key is ResourceKind.CPU else 0
        return _claim(NonElastic(), 1, 1, max(1, charge - fixed), 1.0)
    if spec.key is not ResourceKind.CPU:
        cost = max(1, spec.demand_min.cpu_millicores)
        return _claim(NonElastic(), 1, 1, cost, 1.0)
    lo, hi = spec.dop_min, spec.dop_max
    if fixed_dop is not None:
        lo = hi = min(max(fixed_dop, spec.dop_min), spec.dop_max)
    elif cap is not None:
        hi = min(hi, max(cap, knee(spec.elasticity, lo, hi)))
    t_ori = ledger.estimated_t_ori(ed, qa)
    try:
        return _claim(spec.elasticity, lo, hi, spec.demand_per_unit.cpu_millicores, t_ori)
    except TypeError:  # an unhashable (e.g. still-learning) model: never cache it
        return _build_claim(spec.elasticity, lo, hi, spec.demand_per_unit.cpu_millicores, t_ori)


def _build_claim(elasticity: ElasticityModel, lo: int, hi: int, unit_cost: int, t_ori: float) -> Claim:
    return Claim.of(lo, hi, unit_cost, lambda m: elasticity.duration_s(t_ori, m))


# Most actions of a kind share one learned T_ori, so a round rebuilds few claims.
_claim = functools.lru_cache(maxsize=8192)(_build_claim)


def start_dop(qa: QueuedAction, claim_dop: int) -> int:
    """The DoP to start with: the claim's for CPU-elastic actions, else the spec's minimum."""
    return claim_dop if qa.spec.key is ResourceKind.CPU else qa.spec.dop_min


def releases_on(ed: StateEditor, node_id: str) -> list[tuple[float, int]]:
    """(expected end, millicores) of the actions running on ``node_id``: the heap's seed."""
    return [(r.expected_end_s, r.grant.cpu_millicores) for r in ed.running.values() if r.node_id == node_id and r.grant.cpu_millicores]


def start_pools(
    ed: StateEditor,
    pools: Pools,
    cause: str,
    depth: int,
    fixed_dop: int | None,
    evict: bool,
    aging_s: float = float("inf"),
    tries: int = 8,
    caps: Mapping[str, int] | None = None,
    pack: bool = False,
) -> list[Decision]:
    """Start each touched node's candidates: fixed DoP, or water-filled with up to ``tries``
    greedy deferrals (``evict``), each elastic claim capped at its node's ``caps`` entry;
    ``pack``: single-core env actions charged by their measured use (``core.packing``)."""
    decisions: list[Decision] = []
    for node_id in sorted(pools.candidates):
        if evict and not ed.is_touched(node_id):
            continue  # nothing changed there since its last plan: the plan stands
        cands = pools.candidates[node_id]
        cap = caps.get(node_id) if caps else None
        claims = [claim_of(ed, qa, fixed_dop, cap, pack) for qa in cands]
        fixed_part = sum(qa.spec.demand_fixed.cpu_millicores for qa in cands if qa.spec.key is ResourceKind.CPU)
        budget = ed.cpu[node_id].free_millicores - fixed_part
        if evict:
            backlog = [claim_of(ed, qa, fixed_dop, cap, pack) for qa in pools.backlog.get(node_id, [])]
            deferrable = [ed.now_s - qa.submitted_s < aging_s for qa in cands]
            plan = plan_pool(claims, budget, releases_on(ed, node_id), ed.now_s, tries, backlog, deferrable)
            chosen, dops = plan.start, plan.dops
            priced = f", DoP capped at {cap} for expected arrivals" if cap is not None else ""
            reason = f"elastic: water-filled over {len(cands)} candidates, {plan.evictions} deferred{priced}"
        else:
            chosen, dops = tuple(range(len(cands))), tuple(c.dop_min for c in claims)
            reason = f"fixed DoP {fixed_dop}"
        for qa, dop in zip([cands[i] for i in chosen], dops, strict=True):
            mem = pools.mem.get(qa.spec.action_id)
            charge = packing.charge_mc(ed, qa.spec) if pack else None
            decisions.append(ledger.start_action(ed, qa, node_id, start_dop(qa, dop), reason, cause, mem_bytes=mem, cpu_charge_mc=charge))
    return decisions
