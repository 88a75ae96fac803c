"""Core: the opportunity cost of cores, as a DoP cap per node pool (look-ahead over a run).

A core granted now is held for the whole run of the action it goes to (a DoP is fixed
for a run), so it is missing for every action that arrives on that node meanwhile.
Water-filling the spare cores among the candidates present prices them at zero: at a
quiet moment it hands out DoP 32 at ~45% parallel efficiency, and the actions that
arrive a second later queue (issue 14's audit: fixed DoP 16 beat that on the headline).

The cap is the widest DoP ``m`` that every elastic action on the node could get during
a run at ``m`` without running out of cores, from what the state shows (a fluid
look-ahead over the horizon ``H(m)``, a typical elastic run at ``m``):

- *available* core-seconds in ``[now, now + H]``: the node's free cores, plus each running
  action's cores from its expected end on (an overdue action counts as ending now);
- *demanded* core-seconds: the candidates and backlog present (elastic ones at ``m`` for
  ``H``, commands for their estimate), and the arrivals expected meanwhile. Envs are a
  closed loop (an env submits again after thinking), so in steady state the pool's
  arrival rate is its completion rate ``Σ 1/d`` over running env actions; it is spread
  over the idle envs of the pool and charged per idle env of the node. Elastic arrivals
  hold ``m`` cores for half the horizon on average; their count is taken half a Poisson
  standard deviation above its mean (``ARRIVAL_Z``), since a burst, not the mean, is what
  finds the node short, but a cap priced for a whole deviation narrows every run for a
  burst that mostly does not come (see ``ARRIVAL_Z``).

When no elastic action runs there is no rate to read; the flow learned from the env
submissions (``core/env_flow.py``: think time, elastic share, command size) stands in, and
the horizon is the present candidates' own run. Without it, a test run arriving in a lull
took every core of a small node and the lints arriving during it queued (on the live
coding workload fixed DoP 1 then beat elastic, 0.112 against 0.121 s mean ACT).

Why a look-ahead and not a snapshot: an earlier cap shared all cores among the elastic
actions in flight; narrow grants make runs longer, so more are in flight, and the cap
shrank on itself (DoP 1-2 with half the dense ablation's cores idle). Here running
actions count by the cores they will release and arrivals by their rate, neither of
which grows when runs get narrower.

The cap only limits what water-filling hands out (the candidates present still compete
exactly, and deferral still weighs them), never goes below ``dop_min``, and never below
the declared curve's efficiency knee (``knee``): narrowing below it saves the pool almost
nothing while the action's run grows like ``1/m``.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arl_tangram.core import env_flow, ledger
from arl_tangram.core.elasticity import ElasticityModel
from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind
from arl_tangram.core.state import QueuedAction, StateEditor

Queues = Mapping[str, Sequence[QueuedAction]]  # node -> queued actions, FCFS

EFFICIENCY_KNEE = 0.9  # below the widest DoP at this parallel efficiency a core saves < 10% of itself
# Expected elastic arrivals are charged at mean + Z · sqrt(mean) (Poisson). Measured on the
# coding sweep (``arl-tangram sim sweep``, 19 settings): 1.0 to 0.5 took the worst setting's
# processor-sharing ratio from 0.995 to 1.036 (test fraction x2: elastic 1.445 -> 1.414 s)
# and moved 14 settings' mean ACT down, 3 up (by 0.1, 0.4 and 1.2 %). At 0.25 and 0, test
# fraction x2 gained a little more (1.410, 1.407 s) and seeds 1-2 at defaults lost (0.825-0.829
# against 0.823-0.827 s); 1.5 and 2 were worse on every setting tried (seeds 1-2, test x2).
ARRIVAL_Z = 0.5
_MIN_RUN_S = 1e-3  # a run's expected length is at least this (guards 1/d)


@dataclass(frozen=True)
class _Flows:
    """The pool's flows this round, from one pass over the running actions.

    ``elastic_s[m - 1]`` is the mean elastic run at DoP ``m`` (the declared curves of the
    running elastic actions, weighted by their rates); ``per_idle_env`` the arrival rate
    of one idle env; ``elastic_share`` the elastic part of arrivals; ``command_core_s``
    the core-seconds one command arrival holds.
    """

    per_idle_env: float
    elastic_share: float
    command_core_s: float
    elastic_s: tuple[float, ...]
    releases: dict[str, tuple[list[float], list[float], list[float]]]  # node -> ends, Σcores, Σcores·end
    active_on: dict[str, int]


def fair_caps(ed: StateEditor, candidates: Queues, backlog: Queues) -> dict[str, int]:
    """DoP cap (in units) per touched node of ``candidates`` this round (see the module doc);
    ``backlog`` is what waits on each node behind them (both from ``cpu_round.collect``).

    A node gets no cap when it has no idle env (everyone who could compete is present and
    water-filling with eviction already weighs them exactly), or when nothing elastic runs
    in the pool and nothing was learned yet to stand in for its rates (``env_flow``)."""
    waiting = {n: len(c) + len(backlog.get(n, ())) for n, c in candidates.items() if ed.is_touched(n)}
    if not waiting:
        return {}
    per_node = ready_envs_per_node(ed)
    idle_pool = sum(per_node.values()) - len(ed.env_busy) - sum(waiting.values())
    widest = max((qa.spec.dop_max for n in waiting for qa in candidates[n] if qa.spec.key is ResourceKind.CPU), default=0)
    flows = _flows(ed, waiting, max(1, idle_pool), widest, candidates)
    if flows is None:
        return {}
    caps: dict[str, int] = {}
    for node_id in sorted(waiting):
        idle = per_node.get(node_id, 0) - flows.active_on.get(node_id, 0) - waiting[node_id]
        if idle > 0:
            present = [*candidates[node_id], *backlog.get(node_id, ())]
            caps[node_id] = _node_cap(ed, present, node_id, flows, flows.per_idle_env * idle)
    return caps


def _flows(ed: StateEditor, nodes: Mapping[str, int], idle_pool: int, widest: int, candidates: Queues) -> _Flows | None:
    """One pass over the running actions (the round's main extra cost, kept lean): pool-wide
    rates, and releases and env activity for ``nodes`` only (the pools this round plans).
    With no elastic action running there is no rate to read: the flow learned from the env
    submissions stands in (``env_flow.learned``), over the horizons of the elastic
    ``candidates`` present; None before anything was learned."""
    rate = elastic_rate = command_millicores = 0.0
    # Σ t_ori/d = Σ S(dop) per kind, and the kind's declared curve (profiled per kind, as in
    # the paper; the first seen stands for it). Kinds, not curves, key it: a string's hash
    # is cached, a curve's is recomputed on every lookup, and this loop runs every round.
    weights: dict[str, float] = {}
    curves: dict[str, ElasticityModel] = {}
    ends: dict[str, list[tuple[float, float]]] = {n: [] for n in nodes}
    active_on = dict.fromkeys(nodes, 0)
    now = ed.now_s
    facts = _run_facts(ed.running)
    for node_id, cores, end, is_env, inv, elastic, kind, curve, speedup, millicores in facts:
        node_ends = ends.get(node_id)
        if node_ends is not None and cores:
            node_ends.append((end if end > now else now, cores))
        if not is_env:
            continue
        if node_ends is not None:
            active_on[node_id] += 1
        rate += inv
        if elastic:
            elastic_rate += inv
            if kind not in curves:
                curves[kind] = curve
            weights[kind] = weights.get(kind, 0.0) + speedup
        else:
            command_millicores += millicores  # cores · d / d
    if widest < 1:
        return None
    releases = {n: _prefix(sorted(v)) for n, v in ends.items()}
    if elastic_rate <= 0.0:
        return _learned_flows(ed, nodes, widest, candidates, releases, active_on)
    kinds = sorted(weights)  # deterministic summation order
    elastic_s = tuple(sum(weights[k] / curves[k].speedup(m) for k in kinds) / elastic_rate for m in range(1, widest + 1))
    commands = rate - elastic_rate
    return _Flows(
        per_idle_env=rate / idle_pool,
        elastic_share=elastic_rate / rate,
        command_core_s=command_millicores / MILLICORES_PER_CORE / commands if commands > 0 else 0.0,
        elastic_s=elastic_s,
        releases=releases,
        active_on=active_on,
    )


_Facts = tuple[str, float, float, bool, float, bool, str, ElasticityModel, float, int]
_FACTS_MEMO: dict[str, tuple[object, _Facts]] = {}  # action id -> (its Running record, its facts)


def _run_facts(running: Mapping[str, Any]) -> list[_Facts]:
    """Per running action, in the running table's order, what ``_flows`` reads of it:
    (node, cores, expected end, env-bound, 1/d, CPU-elastic, kind, curve, speedup at its
    DoP, millicores). Memoised per record: a record is frozen, so while the table holds the
    same record its facts stand, and most rounds change one or two records of hundreds.
    Summed in the same order as before, so every float is the same."""
    memo, out = _FACTS_MEMO, []
    for aid, run in running.items():
        hit = memo.get(aid)
        if hit is None or hit[0] is not run:
            hit = memo[aid] = (run, _facts_of(run))
        out.append(hit[1])
    if len(memo) > 2 * len(running) + 1024:  # forget finished actions now and then
        for aid in [a for a in memo if a not in running]:
            del memo[aid]
    return out


def _facts_of(run: Any) -> _Facts:
    spec = run.spec
    d = run.expected_end_s - run.started_s
    inv = 1.0 / (d if d > _MIN_RUN_S else _MIN_RUN_S)
    elastic = spec.key is ResourceKind.CPU
    speedup = spec.elasticity.speedup(run.dop) if elastic and spec.binding.kind == "env" else 0.0
    return (
        run.node_id, run.grant.cpu_millicores / MILLICORES_PER_CORE, run.expected_end_s, spec.binding.kind == "env",
        inv, elastic, spec.kind, spec.elasticity, speedup, run.grant.cpu_millicores,
    )  # fmt: skip


def _learned_flows(
    ed: StateEditor, nodes: Mapping[str, int], widest: int, candidates: Queues,
    releases: dict[str, tuple[list[float], list[float], list[float]]], active_on: dict[str, int],
) -> _Flows | None:  # fmt: skip
    """The flows when no elastic action runs: arrivals from ``env_flow.learned``, the
    horizon at each DoP the mean run of the elastic candidates present (on their declared
    curves). None before anything was learned, or with no elastic candidate to cap."""
    learned = env_flow.learned(ed)
    if learned is None:
        return None
    present = [qa for n in nodes for qa in candidates.get(n, ()) if qa.spec.key is ResourceKind.CPU and qa.spec.dop_max > 1]
    if not present:
        return None
    t_ori = [ledger.estimated_t_ori(ed, qa) for qa in present]
    elastic_s = tuple(
        sum(t / qa.spec.elasticity.speedup(m) for t, qa in zip(t_ori, present, strict=True)) / len(present) for m in range(1, widest + 1)
    )  # fmt: skip
    return _Flows(learned.per_idle_env, learned.elastic_share, learned.command_core_s, elastic_s, releases, active_on)


def _prefix(ends: list[tuple[float, float]]) -> tuple[list[float], list[float], list[float]]:
    at, cores, weighted = [], [0.0], [0.0]
    for end, c in ends:
        at.append(end)
        cores.append(cores[-1] + c)
        weighted.append(weighted[-1] + c * end)
    return at, cores, weighted


def _node_cap(ed: StateEditor, present: Sequence[QueuedAction], node_id: str, flows: _Flows, arrivals_per_s: float) -> int:
    """The widest DoP whose run's demanded core-seconds fit in what the node has (≥ 1).

    Scanned upwards and stopped at the first DoP that does not fit (a scan on past it, for
    a wider DoP that fits again, gave the same runs on the coding and dense-ablation
    workloads, and costs the whole range every round)."""
    now = ed.now_s
    free = ed.cpu[node_id].free_millicores / MILLICORES_PER_CORE
    at, cores, weighted = flows.releases.get(node_id, ([], [0.0], [0.0]))
    present_elastic, present_commands = 0, []
    for qa in present:
        if qa.spec.key is ResourceKind.CPU:
            present_elastic += 1
        else:
            present_commands.append((ledger.estimated_t_ori(ed, qa), qa.spec.demand_min.cpu_millicores / MILLICORES_PER_CORE))
    commands_core_s = _CommandsCoreS(present_commands)
    share = flows.elastic_share
    cap = 1
    for m, horizon in enumerate(flows.elastic_s, start=1):
        j = bisect.bisect_right(at, now + horizon)
        available = free * horizon + cores[j] * (now + horizon) - weighted[j]
        elastic_arrivals = arrivals_per_s * share * horizon
        elastic_arrivals += ARRIVAL_Z * math.sqrt(elastic_arrivals)
        demanded = (
            present_elastic * m * horizon
            + commands_core_s.within(horizon)
            + elastic_arrivals * m * horizon / 2.0
            + arrivals_per_s * (1.0 - share) * horizon * flows.command_core_s
        )
        if demanded > available:
            break
        cap = m
    return cap


class _CommandsCoreS:
    """``Σ cores · min(duration, H)`` over the commands present, in O(log n) per horizon
    (a wake-up plans every node, each over up to 32 horizons)."""

    def __init__(self, commands: list[tuple[float, float]]) -> None:
        commands.sort()
        self.durations = [d for d, _ in commands]
        self.core_s = [0.0]  # prefix Σ cores · duration
        self.cores_after = [0.0] * (len(commands) + 1)  # suffix Σ cores
        for d, c in commands:
            self.core_s.append(self.core_s[-1] + c * d)
        for i in range(len(commands) - 1, -1, -1):
            self.cores_after[i] = self.cores_after[i + 1] + commands[i][1]

    def within(self, horizon: float) -> float:
        j = bisect.bisect_right(self.durations, horizon)  # these end within the horizon
        return self.core_s[j] + self.cores_after[j] * horizon


def knee(elasticity: ElasticityModel, dop_min: int, dop_max: int) -> int:
    """The widest DoP in ``[dop_min, dop_max]`` whose parallel efficiency is still at least
    ``EFFICIENCY_KNEE`` (``dop_min`` when none is): the floor of any cap."""
    try:
        return _knee(elasticity, dop_min, dop_max)
    except TypeError:  # an unhashable (still-learning) model: never cache it
        return _knee.__wrapped__(elasticity, dop_min, dop_max)


@functools.lru_cache(maxsize=1024)
def _knee(elasticity: ElasticityModel, dop_min: int, dop_max: int) -> int:
    best = dop_min
    for m in range(dop_min, dop_max + 1):
        if elasticity.efficiency(m) < EFFICIENCY_KNEE:
            break
        best = m
    return best


_ENVS_MEMO: list[object] = [None, None]  # (a frozen envs table, its ready envs per node)


def ready_envs_per_node(ed: StateEditor) -> dict[str, int]:
    """Ready envs per node, memoised on the envs table of the round's base state.

    Correct because a table that this round has not written is the frozen table of a
    past state, which nothing mutates (``StateEditor.w`` copies before the first write);
    the memo holds a reference to it, so its identity cannot be reused by another table.
    A table written this round may still change, so it is counted afresh and not kept.
    Rounds that place or release no env (most of them) pay nothing."""
    envs = ed.envs
    if _ENVS_MEMO[0] is envs:
        counts: dict[str, int] = _ENVS_MEMO[1]  # type: ignore[assignment]
        return counts
    counts = {}
    for env in envs.values():
        if env.ready and env.node_id is not None:
            counts[env.node_id] = counts.get(env.node_id, 0) + 1
    if "envs" not in ed._copied:  # noqa: SLF001 -- the base table is immutable, see above
        _ENVS_MEMO[0], _ENVS_MEMO[1] = envs, counts
    return counts
