"""``sim.srpt_replay``: exact preemptive shortest-remaining-first on identical cores."""

from __future__ import annotations

import itertools
import random

import pytest

from arl_tangram.sim.srpt_replay import srpt_flow_times


def test_a_shorter_arrival_preempts_the_longer_run() -> None:
    # one core: the 3-s job runs, the 1-s job arriving at 1 s takes the core at once
    assert srpt_flow_times([0.0, 1.0], [3.0, 1.0], cores=1) == pytest.approx([4.0, 1.0])  # FCFS: [3, 3]


def test_each_core_serves_the_least_remaining_and_a_freed_core_is_reused() -> None:
    assert srpt_flow_times([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], cores=2) == pytest.approx([1.0, 2.0, 4.0])
    # an idle gap before a late arrival, and a zero-length job
    assert srpt_flow_times([0.0, 5.0, 5.0], [1.0, 0.0, 2.0], cores=1) == pytest.approx([1.0, 0.0, 2.0])
    assert srpt_flow_times([-2.0, -1.5], [1.0, 1.0], cores=1) == pytest.approx([1.0, 1.5]), "times before zero"


def test_on_one_core_no_order_of_whole_runs_has_a_lower_total() -> None:
    """SRPT is optimal on one core: every non-preemptive order (arrivals respected) is at least as long."""
    rng = random.Random(7)
    for _ in range(30):
        arrivals = [round(rng.uniform(0, 3), 2) for _ in range(5)]
        sizes = [round(rng.uniform(0.1, 2), 2) for _ in range(5)]
        srpt = sum(srpt_flow_times(arrivals, sizes, cores=1))
        for order in itertools.permutations(range(5)):
            now, total = 0.0, 0.0
            for i in order:
                now = max(now, arrivals[i]) + sizes[i]
                total += now - arrivals[i]
            assert srpt <= total + 1e-9


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="2 arrivals but 1 sizes"):
        srpt_flow_times([0.0, 1.0], [1.0], cores=1)
    with pytest.raises(ValueError, match="cores must be >= 1"):
        srpt_flow_times([0.0], [1.0], cores=0)
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        srpt_flow_times([0.0], [-1.0], cores=1)
