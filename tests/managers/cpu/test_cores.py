"""Which cpus back a grant: NUMA packing, least-loaded choice, accounting invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arl_tangram.managers.cpu.cores import CoreAllocationModel
from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.topology import CpuTopology, read_topology

TWO_NODES = CpuTopology({0: (0, 1, 2, 3), 1: (4, 5, 6, 7)})


def test_grant_stays_on_one_node_when_it_fits() -> None:
    model = CoreAllocationModel(TWO_NODES)
    a = model.acquire(3)
    b = model.acquire(4)
    assert {TWO_NODES.node_of(c) for c in a} == {0}
    assert {TWO_NODES.node_of(c) for c in b} == {1}  # node 0 has only 1 idle cpu left


def test_best_fit_keeps_a_whole_node_free() -> None:
    model = CoreAllocationModel(TWO_NODES)
    model.acquire(3)
    assert model.acquire(1) == (3,)  # fills node 0's hole, node 1 stays whole


def test_oversubscription_shares_least_loaded() -> None:
    model = CoreAllocationModel(CpuTopology({0: (0, 1)}))
    assert model.acquire(2) == (0, 1)
    assert len(model.acquire(5)) == 2  # capped at the cpus there are
    assert model.load() == {0: 2, 1: 2}


def test_bad_input_names_the_field() -> None:
    model = CoreAllocationModel(TWO_NODES)
    with pytest.raises(InvalidRequestError, match="cores"):
        model.acquire(0)
    with pytest.raises(InvalidRequestError, match="cpus"):
        model.release((0,))


def test_host_topology_covers_affinity() -> None:
    import os

    topo = read_topology()
    assert set(topo.cpus) == set(os.sched_getaffinity(0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 10)), max_size=40))
def test_load_is_conserved(ops: list[tuple[bool, int]]) -> None:
    model = CoreAllocationModel(TWO_NODES)
    held: list[tuple[int, ...]] = []
    for release, n in ops:
        if release and held:
            model.release(held.pop(n % len(held)))
        else:
            cpus = model.acquire(n)
            assert len(cpus) == min(n, 8) and len(set(cpus)) == len(cpus)
            held.append(cpus)
        expected = {c: sum(c in g for g in held) for c in range(8)}
        assert model.load() == expected
