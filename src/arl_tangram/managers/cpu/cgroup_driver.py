"""Shell: the interface both cgroup drivers implement, and the layout they share.

Layout (names are paths relative to each controller's parent group):

    arl-tangram-<pid>-<rand>/            one per manager ("the root group")
        sb-<sandbox_id>/                 one per sandbox: cpu quota, cpuset, memory, pids, freezer
            <slot>/                      one per running action / session / the init: its own
                                         cpuset and quota (exactly its grant), accounting
                                         (cpu time, peak memory), freezing and killing of
                                         exactly one action's process tree

A process joins a slot by writing its own pid into every file of ``join_files`` *before*
it execs into the sandbox, so nothing it runs ever escapes the limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from arl_tangram.managers.cpu.memory_watch import MemoryWatch

#: cfs period used for grants; 100 ms is the kernel default and keeps throttling smooth.
CPU_PERIOD_US = 100_000
#: smallest quota the kernel accepts; used (with the freezer) for idle sandboxes.
CPU_QUOTA_MIN_US = 1_000
#: slot that holds the sandbox's init (and its bubblewrap monitor).
INIT_SLOT = "init"


class CgroupDriver(Protocol):
    """What the sandbox code needs from cgroups. All methods are blocking and thread-safe
    as long as two threads never operate on the same sandbox at once (the manager holds a
    per-sandbox lock). ``sandbox`` arguments are sandbox group names (``sb-...``)."""

    version: int
    root_name: str

    def describe(self) -> str: ...

    def create_root(self) -> None: ...

    def remove_root(self) -> None: ...

    def create_sandbox(self, sandbox: str, mem_bytes: int, pids_max: int, cpus: Sequence[int]) -> None: ...

    def remove_sandbox(self, sandbox: str) -> None: ...

    def create_slot(self, sandbox: str, slot: str) -> None: ...

    def remove_slot(self, sandbox: str, slot: str) -> None: ...

    def join_files(self, sandbox: str, slot: str) -> tuple[str, ...]: ...

    def set_grant(self, sandbox: str, cpus: Sequence[int] | None, quota_us: int | None) -> None: ...

    def set_slot_grant(self, sandbox: str, slot: str, cpus: Sequence[int] | None, quota_us: int | None) -> None: ...

    def set_shares(self, sandbox: str, shares: int) -> None: ...

    def list_sandboxes(self) -> list[str]: ...

    def sibling_roots(self) -> list[str]: ...

    def root_exists(self) -> bool: ...

    def set_limits(self, sandbox: str, mem_bytes: int, pids_max: int) -> None: ...

    def freeze(self, sandbox: str) -> None: ...

    def thaw(self, sandbox: str) -> None: ...

    def slot_pids(self, sandbox: str, slot: str) -> list[int]: ...

    def sandbox_pids(self, sandbox: str) -> list[int]: ...

    # tasks charged to the sandbox's pids budget that no group lists any more: exited, not
    # yet reaped (zombies; ``actions.settle_reaped``)
    def sandbox_unreaped(self, sandbox: str) -> int: ...

    def kill_slot(self, sandbox: str, slot: str, *, spare_host: bool = True) -> int: ...

    def kill_sandbox(self, sandbox: str, *, spare_host: bool = True) -> int: ...

    def reset_slot_counters(self, sandbox: str, slot: str) -> None: ...

    def slot_cpu_ns(self, sandbox: str, slot: str) -> int: ...

    def slot_peak_bytes(self, sandbox: str, slot: str) -> int: ...

    def sandbox_memory_bytes(self, sandbox: str) -> int: ...

    def sandbox_cpu_ns(self, sandbox: str) -> int: ...

    def oom_kills(self, sandbox: str) -> int: ...

    def slot_oom_kills(self, sandbox: str, slot: str) -> int: ...

    # memory per action (see ``memory_watch``): a hard limit (the env's own, or the grant
    # when pause-and-grow is off), the kernel's OOM killer off at it (v1), a grant armed
    # softly under the env's limit, and the idle footprint
    def set_memory_limit(self, sandbox: str, limit_bytes: int) -> None: ...

    def set_memory_pause(self, sandbox: str, on: bool) -> None: ...

    def open_memory_watch(self, sandbox: str, grant_bytes: int, ceiling_bytes: int) -> MemoryWatch | None: ...

    def sandbox_footprint_bytes(self, sandbox: str) -> int: ...

    # a memory limit on the root group, above every sandbox's own (a bench's budget)
    def limit_root_memory(self, limit_bytes: int) -> bool: ...

    def root_memory_limit_bytes(self) -> int | None: ...

    # the memory groups around every sandbox of the node, innermost first (the root group,
    # then the group it is nested in); empty when unisolated (``managers.cpu.node_memory``)
    def memory_dirs(self) -> tuple[str, ...]: ...


def root_shares(num_cpus: int) -> int:
    """The manager's root group's v1 ``cpu.shares``: 1024 per cpu it manages, as kubelet
    weights its pods' group by the node's allocatable CPU. At the default 1024 every
    sandbox together weighed as much as one thread of the server or of a rollout client on
    the host, so a burst of requests starved the runs (issue 26: short programs timed out
    after 3 s having had 20-30 ms of CPU while 500 answers and retries went out)."""
    return max(2, min(262_144, 1024 * num_cpus))


def format_cpus(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the cpulist format of cpuset files)."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` -> ``(0, 1, 2, 5)``; empty text gives ``()``."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(out)))
