"""Shell: what a node's sandboxes really have free, measured (issue 21, memory pressure).

Read from the memory groups around the node's sandboxes (``CgroupDriver.memory_dirs``:
the manager's root group, then the group it is nested in, e.g. a benchmark's budget): for
each, its limit less its usage, page cache the kernel can drop (``inactive_file``) counted
free; the root group's limit is at most the memory the core gives the node. The host's
``MemAvailable`` bounds it too. PSI: the root group's ``memory.pressure`` where the kernel
has one (cgroup v2). On cgroup v1 there is none per group, and the host's
``/proc/pressure/memory`` is not used: it counts every other tenant's stalls, so usage
polling alone decides there. Plain file reads, no locks; callers run it off the loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu.cgroup_fs import read_int, read_keyed, read_text

UNLIMITED_BYTES = 1 << 60  # v1 writes "no limit" as a number near 2**63


@dataclass(frozen=True)
class NodeMemory:
    free_bytes: int
    some_avg10: float | None  # PSI, percent; None: no per-group PSI on this kernel/layout


def _group_free(group_dir: str, cap_bytes: int | None) -> int | None:
    """A group's limit (at most ``cap_bytes``) less what it holds that reclaim keeps; None:
    unlimited and uncapped, or gone."""
    v1 = os.path.exists(os.path.join(group_dir, "memory.limit_in_bytes"))
    limit = read_int(os.path.join(group_dir, "memory.limit_in_bytes" if v1 else "memory.max"), UNLIMITED_BYTES)
    usage = read_int(os.path.join(group_dir, "memory.usage_in_bytes" if v1 else "memory.current"), -1)
    if usage < 0:
        return None
    stat = read_keyed(os.path.join(group_dir, "memory.stat"))
    held = usage - stat.get("total_inactive_file" if v1 else "inactive_file", 0)
    if cap_bytes is not None:
        limit = min(limit, cap_bytes)
    return None if limit >= UNLIMITED_BYTES else max(0, limit - max(0, held))


def _mem_available_bytes() -> int | None:
    try:
        for line in read_text("/proc/meminfo").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _psi_some_avg10(group_dir: str) -> float | None:
    try:
        text = read_text(os.path.join(group_dir, "memory.pressure"))
    except OSError:
        return None
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
        if line.startswith("some") and "avg10" in fields:
            return float(fields["avg10"])
    return None


def measure(memory_dirs: Sequence[str], node_mem_bytes: int) -> NodeMemory:
    """The node's free memory for sandboxes now. With no groups (unisolated), the node's
    memory bounded by the host's ``MemAvailable``."""
    frees = [f for i, d in enumerate(memory_dirs) if (f := _group_free(d, node_mem_bytes if i == 0 else None)) is not None]
    available = _mem_available_bytes()
    if available is not None:
        frees.append(available)
    free = min(frees) if frees else node_mem_bytes
    psi = _psi_some_avg10(memory_dirs[0]) if memory_dirs else None
    return NodeMemory(min(free, node_mem_bytes), psi)


__all__ = ["NodeMemory", "measure"]
