"""The simulator runs preemption with the core's own policy code (issue 26): the elastic
policy's ``PreemptAction`` demotes single-core runs, which then progress only on the cores
granted runs leave idle (``sim.demoted``), so the node's CPU is never overcommitted, every
action still completes, and short actions stop waiting behind long ones (mean ACT falls)."""

from __future__ import annotations

import numpy as np

from arl_tangram.core.decisions import PreemptAction
from tests.sim.test_simulation import simulate

CORES = 4


def _run(params: dict[str, float]) -> tuple[int, float, float, int]:
    sim, result = simulate(("coding", {"batch": 24}, "elastic", params, "tangram", 1, CORES, 0), keep=True)
    m = result.metrics
    _, used = m.used["cpu"].series(m.step_s(), bins=2000)
    preempts = sum(isinstance(d, PreemptAction) for d in result.decisions)
    return preempts, m.act_summary()["mean_s"], float(np.max(used)), len(m.done())


def test_demoted_runs_share_only_idle_cores_and_short_actions_stop_waiting() -> None:
    preempts, mean_s, peak_cores, done = _run({"preempt_quantum_s": 0.3})
    off_preempts, off_mean_s, _, off_done = _run({})
    assert preempts > 0 and off_preempts == 0 and done == off_done
    assert peak_cores <= CORES * 1.001, peak_cores  # a demoted run never runs on a granted core
    assert mean_s < off_mean_s, (mean_s, off_mean_s)
