"""Shell: the node's CPU topology (NUMA nodes and their cpus) as the manager may use it.

Read once at manager start from ``/sys/devices/system/node`` and intersected with the cpus
this process may run on; hosts without NUMA information are one node.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from arl_tangram.managers.cpu.cgroup_driver import parse_cpus


@dataclass(frozen=True)
class CpuTopology:
    """``nodes[i]`` = the usable cpus of NUMA node ``i`` (only nodes with usable cpus)."""

    nodes: dict[int, tuple[int, ...]]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for cpus in self.nodes.values() for c in cpus))

    @property
    def domains(self) -> tuple[tuple[int, ...], ...]:
        """The usable cpus of each NUMA domain, indexed by domain ``d`` = position in node-id
        order. ``numa_millicores[d]`` of a grant refers to ``domains[d]``."""
        return tuple(self.nodes[n] for n in sorted(self.nodes))

    def numa_cores(self) -> tuple[int, ...]:
        """Usable cores per NUMA domain (same indexing as ``domains``)."""
        return tuple(len(cpus) for cpus in self.domains)

    def node_of(self, cpu: int) -> int:
        for node, cpus in self.nodes.items():
            if cpu in cpus:
                return node
        raise KeyError(cpu)


def read_topology(sys_node_dir: str = "/sys/devices/system/node", allowed: set[int] | None = None) -> CpuTopology:
    """Topology of this host restricted to ``allowed`` (default: this process's affinity)."""
    usable = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    nodes: dict[int, tuple[int, ...]] = {}
    for path in sorted(glob.glob(os.path.join(sys_node_dir, "node*"))):
        match = re.fullmatch(r"node(\d+)", os.path.basename(path))
        if match is None:
            continue
        try:
            with open(os.path.join(path, "cpulist"), encoding="ascii") as f:
                cpus = tuple(c for c in parse_cpus(f.read()) if c in usable)
        except OSError:
            continue
        if cpus:
            nodes[int(match.group(1))] = cpus
    covered = {c for cpus in nodes.values() for c in cpus}
    if not nodes or covered != usable:
        # no (or partial) NUMA info: put the uncovered cpus on a node of their own
        rest = tuple(sorted(usable - covered))
        if rest:
            nodes[max(nodes, default=-1) + 1] = rest
    return CpuTopology(nodes)
