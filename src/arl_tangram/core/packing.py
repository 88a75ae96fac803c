"""Core: packing single-core CPU actions by their measured CPU use (pure; no clock, no I/O).

Why: an exclusive core is held from an action's start to its finish, and a short program
leaves most of that time idle: on this host ``python3 -c`` with a one-line program uses
15 ms of CPU in the ~70 ms the core is held (process start in the sandbox, the manager's
cgroup writes, the result's way back). Exclusive grants then serve two cores' worth of
such runs at a fifth of the cores' speed, while a server that starts every run at once
(SandboxFusion, a Burstable pod) lets them overlap (issue 26: 3-5x our p99 on verl's load).

Rule (Kubernetes' requests and limits, with the request measured instead of declared):
- A kind's CPU *use* is the smoothed ``cpu_s / held_s`` of its finished runs (``held_s``:
  start to finish on the core's clock, pauses excluded), counting only runs that were never
  paused or preempted: a demoted run's share says nothing of what it wants.
- A queued non-elastic env action (``dop_max == 1``, ``packable``) of a kind with ``MIN_SAMPLES`` runs is
  *charged* ``PACK_MARGIN`` x its use of its demand on its node's ledger, at least
  ``PACK_FLOOR_MC`` (so at most 1000 / ``PACK_FLOOR_MC`` runs share a cpu); its cgroup's limit
  stays its whole demand (``StartAction.cpu_limit_millicores``), so a burst runs at full
  speed. A charge over half the demand (two would not share a cpu) is the whole demand:
  no packing.
- A packed run that turns out CPU-bound (one that loops) shares its cpu only until its first
  quantum: preemption demotes it then like any other (``core.preemption``).
Runs sharing a cpu under CFS slow each other only when their bursts overlap. Packing feeds
back on its own measure: runs that share a cpu are held longer, so their measured use
falls and the next ones are packed tighter; ``PACK_FLOOR_MC`` bounds that loop. The two
constants are assumptions, set on verl's load (``bench verdicts``, a probe outside git):
with ``PACK_MARGIN`` 1.0 and a 100-mc floor the core queue's p50 was 0.05-0.3 s, with 1.5
and 250 mc 2.1-2.6 s, on the same totals (the host was saturated either way).
"""

from __future__ import annotations

import math

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.resources import ResourceKind
from arl_tangram.core.state import Running, StateEditor

PACK_MARGIN = 1.0  # assumption: the measured mean use; bursts that collide share the cpu under CFS
PACK_FLOOR_MC = 100  # assumption: at most 10 packed runs per cpu, whatever their use
MIN_SAMPLES = 3  # runs of a kind measured before any of its actions is packed
SMOOTHING_RUNS = 16  # the use is a running mean over the first runs, then an EWMA of this span
MIN_HELD_S = 0.005  # shorter holds are clock noise, not a use


def packable(spec: ActionSpec) -> bool:
    """The shape packing applies to: a non-elastic (``dop_max == 1``) action on an env that
    needs CPU and no device."""
    if spec.binding.kind != "env" or spec.dop_max != 1 or spec.key not in (None, ResourceKind.CPU):
        return False
    demand = spec.demand_at(1)
    return demand.cpu_millicores > 0 and demand.gpu_devices == 0


def charge_mc(ed: StateEditor, spec: ActionSpec) -> int | None:
    """The millicores a packed ``spec`` is charged on its node's ledger (less than its
    demand), or None when it is charged its whole demand: not ``packable``, its kind not yet
    measured, or measured to use over half of it (see the module doc)."""
    n_use = ed.cpu_use.get(spec.kind)
    if n_use is None or n_use[0] < MIN_SAMPLES or not packable(spec):
        return None
    demand = spec.demand_at(1).cpu_millicores
    wanted = max(math.ceil(PACK_MARGIN * n_use[1] * demand), PACK_FLOOR_MC)
    # over half its demand, two would not share a cpu anyway: the whole, exclusive grant
    return wanted if 2 * wanted <= demand else None


def observe(ed: StateEditor, run: Running, cpu_s: float | None, paused_s: float = 0.0) -> None:
    """Feed a finished run's measured CPU seconds into its kind's use (module doc); a run
    that was demoted or paused (by the core, or ``paused_s`` by its manager) teaches nothing."""
    if cpu_s is None or cpu_s < 0 or not packable(run.spec) or run.pause_cause or run.paused_s > 0 or paused_s > 0:
        return
    held_s = ed.now_s - run.started_s
    limit_cores = run.spec.demand_at(1).cpu_millicores / 1000
    if held_s < MIN_HELD_S or limit_cores <= 0:
        return
    use = min(1.0, cpu_s / (held_s * limit_cores))
    n, mean = ed.cpu_use.get(run.spec.kind, (0, 0.0))
    weight = 1.0 / min(n + 1, SMOOTHING_RUNS)
    ed.w("cpu_use")[run.spec.kind] = (n + 1, mean + weight * (use - mean))
