"""Core: memory per action: envs hold their idle footprint, actions get their peaks, and an
action over its grant pauses while the core decides (pure accounting, no I/O).

The model (issue 21):
  * An env whose policy charges memory per action (``EnvState.per_action_memory``) holds
    its *footprint*: the node's smoothed measurement (``EnvFootprint``), a prior until the
    first one. Its limit (``EnvSpec.mem_bytes``) is a ceiling, never reserved up front.
  * An action is granted its memory demand on top, for its life: declared
    (``ActionSpec.memory_bytes``), else learned per kind (a high quantile of the peaks
    seen, with a margin), else everything up to its env's limit. The env's cgroup limit is
    footprint + its running actions' grants (``limit_bytes``).
  * A node admits an env or an action when the footprints + running grants + the
    memory paused actions wait for + the policy's reserve fit in its memory.
  * An action that reaches its env's cgroup limit pauses (``ActionMemoryPaused``): each
    round, the paused actions of a node are served FCFS (oldest first; none overtakes the
    head, and new starts see their wanted bytes as taken, so nothing starves); the head grows
    when the node has the memory, else waits. Past its env's limit it ends ``oom_killed``.
  * No deadlock: when a node's paused head cannot grow and every action holding memory on
    the node is paused (nothing will finish without growing), the youngest paused action
    (latest in queue order) is ended ``oom_killed``, cause ``memory_deadlock``. A head held
    back only by the node's reported pressure (``core.mem_pressure``) is no deadlock: it
    waits for the node to recover (the kernel's own OOM killer stays the last resort).
"""

from __future__ import annotations

from dataclasses import replace

from arl_tangram.core import mem_pressure
from arl_tangram.core.decisions import Decision, GrowMemory, OomKill
from arl_tangram.core.env_spec import EnvSpec
from arl_tangram.core.state import EnvState, Running, StateEditor

MIB = 1 << 20
#: charged for an env's footprint until the node measured it. Assumption: issue 21 measures
#: ~1.2 MB idle for our sandboxes; 16 MiB leaves room for a first tool's page cache.
FOOTPRINT_PRIOR_BYTES = 16 * MIB
PEAK_WINDOW = 64  # peaks kept per kind (newest last)
PEAK_MIN_SAMPLES = 3  # a kind seen fewer times is charged its env's limit
PEAK_QUANTILE = 0.95  # of the peaks seen: the demand learned per kind (like T_ori)
PEAK_MARGIN = 1.25  # over the quantile: tails beyond it pause and grow rather than fail
GROW_STEP_BYTES = 64 * MIB  # the least a pause grows a grant by
# No headroom above the learned peaks: an action over its grant pauses and grows (a kernel
# allocation or a tmpfs write included, ``managers.cpu.memory_watch``), it never fails there.


def footprint_prior(spec: EnvSpec) -> int:
    return min(spec.mem_bytes, FOOTPRINT_PRIOR_BYTES)


def observe_footprint(ed: StateEditor, env_id: str, measured_bytes: int) -> None:
    """Smooth a measured idle footprint (rises at once, falls by halves: a leak is charged
    now, a one-off dip does not free memory another env would then miss) and charge it.

    The charge is capped by the env's limit and by the node's free memory (the footprint
    is real usage: what cannot be charged shows in ``over_bytes``, and the node stops
    admitting because it has nothing free)."""
    old = ed.env_footprint.get(env_id)
    smoothed = measured_bytes if old is None else max(measured_bytes, (old + measured_bytes) // 2)
    ed.w("env_footprint")[env_id] = smoothed
    env = ed.envs.get(env_id)
    if env is None or env.node_id is None or not env.per_action_memory or env.node_id not in ed.cpu:
        return
    free = ed.cpu[env.node_id]
    grants = env_grants(ed, env_id)
    target = min(smoothed, env.spec.mem_bytes - grants)
    delta = min(target - env.held.mem_bytes, max(0, free.free_mem_bytes))
    if delta:
        ed.w("cpu")[env.node_id] = replace(free, free_mem_bytes=free.free_mem_bytes - delta)
        held = replace(env.held, mem_bytes=env.held.mem_bytes + delta)
        ed.w("envs")[env_id] = replace(env, held=held)


def over_bytes(ed: StateEditor, env_id: str) -> int:
    """How much of the env's measured footprint the node could not charge."""
    env = ed.envs.get(env_id)
    if env is None or not env.per_action_memory:
        return 0
    return max(0, ed.env_footprint.get(env_id, 0) - env.held.mem_bytes)


def observe_peak(ed: StateEditor, kind: str, peak_bytes: int | None) -> None:
    if peak_bytes is None or peak_bytes <= 0:
        return
    peaks = (*ed.mem_peaks.get(kind, ()), int(peak_bytes))[-PEAK_WINDOW:]
    ed.w("mem_peaks")[kind] = peaks


# kind -> (the peaks tuple last read, its learned peak): a round asks once per queued action
# of the kind, and sorting the window each time was a visible share of a scheduling round.
_PEAK_MEMO: dict[str, tuple[tuple[int, ...], int | None]] = {}


def learned_peak(ed: StateEditor, kind: str) -> int | None:
    """The learned demand of ``kind``: its peaks' ``PEAK_QUANTILE`` times ``PEAK_MARGIN``.

    Memoised on the identity of the kind's peaks tuple: a tuple never changes (a new peak
    makes a new one, ``observe_peak``) and the memo holds it, so its id cannot be reused."""
    peaks = ed.mem_peaks.get(kind, ())
    hit = _PEAK_MEMO.get(kind)
    if hit is not None and hit[0] is peaks:
        return hit[1]
    value = _learned_peak_of(peaks)
    if not isinstance(peaks, tuple):
        return value  # a caller's mutable sequence: its identity proves nothing
    if len(_PEAK_MEMO) > 4096:  # kinds are few; a run that names thousands starts afresh
        _PEAK_MEMO.clear()
    _PEAK_MEMO[kind] = (peaks, value)
    return value


def _learned_peak_of(peaks: tuple[int, ...]) -> int | None:
    if len(peaks) < PEAK_MIN_SAMPLES:
        return None
    ordered = sorted(peaks)
    q = ordered[min(len(ordered) - 1, int(PEAK_QUANTILE * len(ordered)))]
    return int(q * PEAK_MARGIN)


def env_grants(ed: StateEditor, env_id: str, excluding: str | None = None) -> int:
    """Memory granted to the env's running actions (bytes)."""
    return sum(ed.running[a].grant.mem_bytes for a in ed.env_busy.get(env_id, ()) if a != excluding and a in ed.running)


def action_grant(ed: StateEditor, env: EnvState, memory_bytes: int | None, kind: str) -> int:
    """The memory an action of ``kind`` on ``env`` is granted at start: declared, else
    learned, else up to its env's limit; never more than the limit leaves above the
    footprint."""
    ceiling = max(0, env.spec.mem_bytes - env.held.mem_bytes)
    want = memory_bytes if memory_bytes is not None else learned_peak(ed, kind)
    return ceiling if want is None else min(want, ceiling)


def env_headroom(ed: StateEditor, env: EnvState) -> int:
    """What the env's limit leaves for one more action's grant beside the running ones."""
    return env.spec.mem_bytes - env.held.mem_bytes - env_grants(ed, env.spec.env_id)


def limit_bytes(ed: StateEditor, env_id: str) -> int:
    """The env's cgroup limit now: footprint + its running actions' grants (<= its limit)."""
    env = ed.envs[env_id]
    return min(env.spec.mem_bytes, env.held.mem_bytes + env_grants(ed, env_id))


def waiting_bytes(ed: StateEditor, node_id: str) -> int:
    """Bytes the node's paused actions wait for (reserved ahead of any new start)."""
    total = 0
    for action_id, want in ed.mem_waits.items():
        run = ed.running.get(action_id)
        if run is not None and run.node_id == node_id:
            total += max(0, want - run.grant.mem_bytes)
    return total


def admissible_bytes(ed: StateEditor, node_id: str, reserve_bytes: int) -> int:
    """Memory a new env or action may take on the node: free, less the reserve, what
    paused actions wait for and the shortfall the node last reported (``core.mem_pressure``)."""
    shortfall = mem_pressure.shortfall_bytes(ed, node_id)
    return ed.cpu[node_id].free_mem_bytes - reserve_bytes - waiting_bytes(ed, node_id) - shortfall


def on_paused(ed: StateEditor, action_id: str, usage_bytes: int) -> None:
    """Record that a running action is paused at its env's limit; the policy's round
    decides (``serve_paused``). Unknown, finished or not-per-action actions are ignored:
    their env's limit is its own and ``serve_paused`` ends them."""
    run = ed.running.get(action_id)
    if run is None or action_id in ed.mem_waits or run.pause_cause == "oom":
        return
    env = ed.envs.get(run.spec.binding.name) if run.spec.binding.kind == "env" else None
    grant = run.grant.mem_bytes
    ceiling = grant if env is None or not env.per_action_memory else env.spec.mem_bytes - env.held.mem_bytes - env_grants(
        ed, env.spec.env_id, excluding=action_id
    )  # fmt: skip
    # doubling bounds the pauses of a run to log2(peak / grant); the step, those of tiny grants
    used_over = usage_bytes - (env.held.mem_bytes if env else 0)
    want = min(ceiling, max(2 * grant, grant + GROW_STEP_BYTES, used_over + GROW_STEP_BYTES))
    ed.w("running")[action_id] = replace(run, paused_since_s=ed.now_s, pause_cause="memory")
    ed.w("mem_waits")[action_id] = max(want, grant)  # == grant: at its ceiling, it cannot grow
    ed.touch(run.node_id)


def _resume(ed: StateEditor, run: Running, grant_bytes: int) -> Running:
    since = run.paused_since_s if run.paused_since_s is not None else ed.now_s
    resumed = replace(
        run, grant=replace(run.grant, mem_bytes=grant_bytes), paused_since_s=None,
        paused_s=run.paused_s + (ed.now_s - since), pause_cause="",
    )  # fmt: skip
    ed.w("running")[run.spec.action_id] = resumed
    del ed.w("mem_waits")[run.spec.action_id]
    return resumed


def _kill(ed: StateEditor, run: Running, reason: str, cause: str) -> OomKill:
    """Order the end of a paused action; it stays running (holding its grant) until its
    ``ActionFinished`` arrives, marked so that it is never picked or grown again."""
    ed.w("running")[run.spec.action_id] = replace(run, pause_cause="oom")
    ed.w("mem_waits").pop(run.spec.action_id, None)
    return OomKill(run.spec.action_id, run.node_id, run.spec.binding.name, reason, cause)


def serve_paused(ed: StateEditor, cause: str, reserve_bytes: int = 0) -> list[Decision]:
    """Each node's paused actions, oldest first: end those at their env's limit, grow the
    head when the node has the memory (then the next), and break a deadlock."""
    decisions: list[Decision] = []
    by_node: dict[str, list[Running]] = {}
    for action_id in sorted(ed.mem_waits, key=lambda a: ed.running[a].seq):
        run = ed.running[action_id]
        _recap_wait(ed, run)
        if ed.mem_waits[action_id] <= run.grant.mem_bytes:
            decisions.append(_kill(ed, run, f"oom: past its env's memory limit ({_limit_of(ed, run)} bytes)", cause))
        else:
            by_node.setdefault(run.node_id, []).append(run)
    for node_id in sorted(by_node):
        decisions += _serve_node(ed, node_id, by_node[node_id], cause, reserve_bytes)
    return decisions


def _recap_wait(ed: StateEditor, run: Running) -> None:
    """Cap a paused action's wanted grant by what its env's limit leaves now: the env's
    footprint may have grown since it paused (a measured footprint is charged at once), and
    footprint + grants never pass the env's limit."""
    env = ed.envs.get(run.spec.binding.name) if run.spec.binding.kind == "env" else None
    if env is None or not env.per_action_memory:
        return
    action_id = run.spec.action_id
    ceiling = env.spec.mem_bytes - env.held.mem_bytes - env_grants(ed, env.spec.env_id, excluding=action_id)
    want = ed.mem_waits[action_id]
    if want > ceiling:
        ed.w("mem_waits")[action_id] = max(ceiling, run.grant.mem_bytes)


def _limit_of(ed: StateEditor, run: Running) -> int:
    env = ed.envs.get(run.spec.binding.name)
    return env.spec.mem_bytes if env is not None else run.grant.mem_bytes


def _serve_node(ed: StateEditor, node_id: str, paused: list[Running], cause: str, reserve_bytes: int) -> list[Decision]:
    decisions: list[Decision] = []
    for run in paused:
        _recap_wait(ed, run)  # a sibling on its env may have grown earlier in this loop
        want = ed.mem_waits[run.spec.action_id]
        delta = want - run.grant.mem_bytes
        if delta <= 0:  # siblings on its env grew first and hold the rest of its limit
            decisions.append(_kill(ed, run, f"oom: past its env's memory limit ({_limit_of(ed, run)} bytes)", cause))
            continue
        free = ed.cpu[node_id]
        if free.free_mem_bytes - reserve_bytes - mem_pressure.shortfall_bytes(ed, node_id) < delta:
            if free.free_mem_bytes - reserve_bytes >= delta:
                return decisions  # only the node's pressure holds it: it waits for the recovery
            break  # FCFS: nothing overtakes the head of the node's paused line
        ed.w("cpu")[node_id] = replace(free, free_mem_bytes=free.free_mem_bytes - delta)
        _resume(ed, run, want)
        env_id = run.spec.binding.name
        reason = f"memory: grant grown {run.grant.mem_bytes} -> {want} bytes, the node has it"
        decisions.append(GrowMemory(run.spec.action_id, node_id, env_id, limit_bytes(ed, env_id), want, reason, cause))
    else:
        return decisions
    holders = [r for r in ed.running.values() if r.node_id == node_id and r.grant.mem_bytes and r.pause_cause != "oom"]
    if all(r.spec.action_id in ed.mem_waits for r in holders):
        victim = max((r for r in holders), key=lambda r: r.seq)
        why = (
            f"memory_deadlock: {len(holders)} actions on node {node_id} are paused for memory and none can grow; "
            "the youngest is ended to free its grant"
        )
        decisions.append(_kill(ed, victim, why, cause))
    return decisions


__all__ = [
    "FOOTPRINT_PRIOR_BYTES",
    "action_grant",
    "admissible_bytes",
    "env_grants",
    "env_headroom",
    "footprint_prior",
    "learned_peak",
    "limit_bytes",
    "observe_footprint",
    "observe_peak",
    "on_paused",
    "over_bytes",
    "serve_paused",
    "waiting_bytes",
]
