"""Core: the opportunity cost of cores, as a DoP cap per node pool.

A core granted now is held for the whole run of the action it goes to (a DoP is fixed
for a run), so it is missing for every action that arrives on that node meanwhile.
Water-filling the spare cores among the candidates present prices them at zero: at a
quiet moment it hands out DoP 32 at ~45% parallel efficiency, and the actions that
arrive a second later queue (issue 14's audit: fixed DoP 16 beat that on the headline).

The price here comes from what the state already shows. Every ready env on a node will
submit actions; the share of envs that have an action in flight (running or queued),
measured over the whole pool, is the chance that an env has one at a given moment (a
snapshot of the busy fraction over ~1,000 envs is steady where one node's is not). So a
node with ``N`` envs expects ``N · busy · elastic_share`` elastic actions in flight
and ``N · busy · (1 - elastic_share)`` single-core commands. The cores left after the
commands, shared evenly, give the fair DoP ``cap``: granting more than ``cap`` to one
action takes a core from an expected arrival. For the identical declared curves an
action kind has, pricing a core at the marginal rate where the curve reaches ``cap``
gives the same allocation as capping at ``cap``, so the cap is the price in closed form.

The cap never goes below ``dop_min``, and only limits what water-filling hands out;
candidates present still share the pool as before (their competition is exact).
"""

from __future__ import annotations

from collections.abc import Mapping

from arl_tangram.core.resources import ResourceKind
from arl_tangram.core.state import StateEditor

_ENV_COUNT_MEMO: list[object] = [None, None]  # (envs mapping, {node: ready envs}) of the last round


def ready_envs_per_node(ed: StateEditor) -> dict[str, int]:
    """Ready envs per node. Memoised on the envs table itself (immutable between rounds that
    place or release no env), so a round that only starts and finishes actions pays nothing."""
    envs = ed.envs
    if _ENV_COUNT_MEMO[0] is envs:
        counts: dict[str, int] = _ENV_COUNT_MEMO[1]  # type: ignore[assignment]
        return counts
    counts = {}
    for env in envs.values():
        if env.ready and env.node_id is not None:
            counts[env.node_id] = counts.get(env.node_id, 0) + 1
    _ENV_COUNT_MEMO[0], _ENV_COUNT_MEMO[1] = envs, counts
    return counts


def fair_caps(ed: StateEditor, waiting: Mapping[str, int]) -> dict[str, int]:
    """DoP cap (in cores) per node of ``waiting`` (node -> actions waiting there this round:
    candidates and backlog). A node gets a cap only when it has idle envs (envs that may
    submit during a run) and expects more than one elastic action in flight; with no
    idle env, everyone who could compete is present and water-filling with eviction
    already weighs them exactly."""
    per_node = ready_envs_per_node(ed)
    total = sum(per_node.values())
    if not total or not waiting:
        return {}
    elastic = 0
    active_on: dict[str, int] = {}  # env-bound actions running per node
    for run in ed.running.values():
        if run.spec.key is ResourceKind.CPU:
            elastic += 1
        if run.spec.binding.kind == "env":
            active_on[run.node_id] = active_on.get(run.node_id, 0) + 1
    queued_elastic = 0
    for qa in ed.queue_cpu.values():
        if qa.spec.key is ResourceKind.CPU:
            queued_elastic += 1
    in_flight = len(ed.env_busy) + len(ed.queue_cpu)
    busy = min(1.0, in_flight / total)
    share = (elastic + queued_elastic) / max(1, len(ed.running) + len(ed.queue_cpu))
    caps: dict[str, int] = {}
    for node_id in sorted(waiting):
        n = per_node.get(node_id, 0)
        idle = n - active_on.get(node_id, 0) - waiting[node_id]
        expect_elastic = n * busy * share
        if idle <= 0 or expect_elastic <= 1.0:
            continue
        commands = n * busy * (1.0 - share)
        caps[node_id] = max(1, int((_cores(ed, node_id) - commands) / expect_elastic))
    return caps


def _cores(ed: StateEditor, node_id: str) -> int:
    for node in ed.spec.cpu_nodes:
        if node.node_id == node_id:
            return sum(node.numa_cores)
    return 0
