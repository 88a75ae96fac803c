"""Shell: what a caller may grant an action or a holding, validated against the node.

The controller names the grant; the manager obeys. ``numa_millicores[d]`` is the millicores
granted in NUMA domain ``d`` (``CpuTopology.domains[d]``): the action gets
``ceil(mc_d / 1000)`` cpus of domain ``d`` (the manager picks which) and a CFS quota of the
total millicores. ``millicores`` alone lets the manager split over domains (packed, least
loaded). ``cores=N`` is a convenience for ``millicores=N*1000``. Nothing named means 1 core.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu.config import validate_cores
from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.topology import CpuTopology

MILLICORES_PER_CORE = 1000


@dataclass(frozen=True)
class GrantRequest:
    """A validated grant. ``per_domain_cpus`` is None when the manager chooses the domains;
    ``num_cpus`` is how many cpus back it (0 for a grant of 0 millicores)."""

    millicores: int
    per_domain_cpus: tuple[int, ...] | None
    num_cpus: int
    dop: int | None = None


def _int(field: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidRequestError(field, f"must be an integer >= {minimum}", value)
    return value


def grant_request(
    topology: CpuTopology,
    *,
    millicores: int | None = None,
    numa_millicores: Sequence[int] | None = None,
    cores: int | None = None,
    dop: int | None = None,
) -> GrantRequest:
    """Validate a grant against the node's usable cpus; errors name the field and the rule.
    Whether 0 millicores is allowed depends on the sandbox's holding and is checked there."""
    n_cpus = len(topology.cpus)
    if cores is not None:
        mc_cores = validate_cores(cores, n_cpus) * MILLICORES_PER_CORE
        if millicores is not None and millicores != mc_cores:
            raise InvalidRequestError("cores", "must agree with millicores (cores * 1000) when both are given", cores)
        millicores = mc_cores
    if dop is not None:
        _int("dop", dop, 1)
    if numa_millicores is not None:
        if isinstance(numa_millicores, str | bytes) or not isinstance(numa_millicores, Sequence):
            raise InvalidRequestError("numa_millicores", "must be a sequence of integers >= 0, one per NUMA domain", numa_millicores)
        per = tuple(_int(f"numa_millicores[{d}]", v, 0) for d, v in enumerate(numa_millicores))
        sizes = topology.numa_cores()
        if len(per) > len(sizes):
            raise InvalidRequestError("numa_millicores", f"must have at most {len(sizes)} entries (NUMA domains)", per)
        total = sum(per)
        if millicores is not None and millicores != total:
            raise InvalidRequestError("numa_millicores", f"must sum to millicores ({millicores})", per)
        cpus = tuple(math.ceil(v / MILLICORES_PER_CORE) for v in per)
        for d, (want, have) in enumerate(zip(cpus, sizes, strict=False)):
            if want > have:
                raise InvalidRequestError(f"numa_millicores[{d}]", f"must be <= {have * MILLICORES_PER_CORE} ({have} usable cores in domain {d})", per[d])
        return GrantRequest(total, cpus, sum(cpus), dop)
    mc = MILLICORES_PER_CORE if millicores is None else _int("millicores", millicores, 0)
    if mc > n_cpus * MILLICORES_PER_CORE:
        raise InvalidRequestError("millicores", f"must be <= {n_cpus * MILLICORES_PER_CORE} (the {n_cpus} usable cpus of this node)", mc)
    return GrantRequest(mc, None, math.ceil(mc / MILLICORES_PER_CORE), dop)


def quota_us(millicores: int) -> int:
    """CFS quota per ``CPU_PERIOD_US`` (100 ms) for ``millicores`` (1000 mc = 100,000 us)."""
    return millicores * 100
