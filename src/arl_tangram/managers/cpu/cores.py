"""Model: which physical cpus back a grant of N cores (pure accounting, no I/O).

The caller (the scheduler, through the agent) decides *how many* cores an action gets; this
model only picks *which* ones: the least-loaded cpus, packed on as few NUMA nodes as possible
(the node whose idle cpus hold the whole grant most tightly wins; ties go to the lower node id, then cpu id, so the
choice is deterministic). Oversubscription is allowed (the caller may grant more than is
free); it then shares the least-loaded cpus, never fails.
"""

from __future__ import annotations

from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.topology import CpuTopology


class CoreAllocationModel:
    """Tracks how many live grants use each cpu. Not thread-safe; the manager locks it."""

    def __init__(self, topology: CpuTopology) -> None:
        self._topology = topology
        self._load = {c: 0 for c in topology.cpus}

    @property
    def num_cpus(self) -> int:
        return len(self._load)

    def load(self) -> dict[int, int]:
        """cpu -> number of live grants that include it (a copy)."""
        return dict(self._load)

    def acquire(self, num_cores: int) -> tuple[int, ...]:
        """Pick ``num_cores`` distinct cpus (capped at the cpus there are) and count them used."""
        if num_cores < 1:
            raise InvalidRequestError("cores", "must be an integer >= 1", num_cores)
        want = min(num_cores, len(self._load))
        picked: list[int] = []
        for node in self._node_order(want):
            free = sorted(self._topology.nodes[node], key=lambda c: (self._load[c], c))
            picked.extend(free[: want - len(picked)])
            if len(picked) == want:
                break
        for c in picked:
            self._load[c] += 1
        return tuple(sorted(picked))

    def acquire_split(self, per_domain: tuple[int, ...]) -> tuple[int, ...]:
        """Pick ``per_domain[d]`` distinct least-loaded cpus of NUMA domain ``d`` (the caller
        chose how many and where; this picks only which) and count them used."""
        domains = self._topology.domains
        if len(per_domain) > len(domains) or any(n > len(domains[d]) for d, n in enumerate(per_domain)):
            raise InvalidRequestError("numa_millicores", f"must fit the usable cores per domain {tuple(map(len, domains))}", per_domain)
        picked: list[int] = []
        for d, n in enumerate(per_domain):
            picked.extend(sorted(domains[d], key=lambda c: (self._load[c], c))[:n])
        for c in picked:
            self._load[c] += 1
        return tuple(sorted(picked))

    def release(self, cpus: tuple[int, ...]) -> None:
        """Return a grant from ``acquire``; releasing cpus that are not held raises."""
        for c in cpus:
            if self._load.get(c, 0) <= 0:
                raise InvalidRequestError("cpus", "must be a grant returned by acquire and not yet released", cpus)
        for c in cpus:
            self._load[c] -= 1

    def _node_order(self, want: int) -> list[int]:
        def idle(node: int) -> int:
            return sum(1 for c in self._topology.nodes[node] if self._load[c] == 0)

        def key(node: int) -> tuple[int, int, int]:
            # best fit among nodes that hold the grant on idle cpus (keeps big holes for big
            # grants); otherwise the node with the most idle cpus first
            n_idle = idle(node)
            return (0, n_idle, node) if n_idle >= want else (1, -n_idle, node)

        return sorted(self._topology.nodes, key=key)
