"""Shell: the cgroup v1 driver (cpu, cpuacct, cpuset, memory, pids, freezer hierarchies).

Each controller may be its own mount (this host mounts cpu and cpuacct separately) and the
manager's own group may differ per controller (memory is nested here), so every controller
gets its own parent directory, found by ``cgroup_detect``. Sandboxes carry every limit;
slots exist only in the accounting hierarchies (cpuacct, memory, freezer): quota, cpuset and
pids of a slot's tasks are those of the sandbox group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence

from arl_tangram.managers.cpu.cgroup_driver import (
    CPU_PERIOD_US,
    CPU_QUOTA_MIN_US,
    INIT_SLOT,
    format_cpus,
)
from arl_tangram.managers.cpu.cgroup_fs import (
    read_int,
    read_keyed,
    read_pids,
    read_text,
    rmdir_retry,
    write_text,
)
from arl_tangram.managers.cpu.errors import CgroupUnavailableError

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "freezer")
_SLOT_CONTROLLERS = ("cpuacct", "memory", "freezer")


class CgroupV1Driver:
    """cgroup v1 implementation of ``CgroupDriver``.

    ``parents`` maps each controller of ``V1_CONTROLLERS`` to the directory under which the
    root group is created (the manager's own group in that hierarchy).
    """

    version = 1

    def __init__(self, parents: Mapping[str, str], root_name: str) -> None:
        missing = [c for c in V1_CONTROLLERS if c not in parents]
        if missing:
            raise CgroupUnavailableError(f"cgroup v1: controllers not mounted: {', '.join(missing)}")
        self.root_name = root_name
        self._parents = dict(parents)
        # Co-mounted controllers (e.g. "cpu,cpuacct") share one directory; act on it once.
        self._dirs = {c: os.path.join(p, root_name) for c, p in parents.items() if c in V1_CONTROLLERS}

    def describe(self) -> str:
        return "cgroup v1: " + ", ".join(f"{c}={self._dirs[c]}" for c in V1_CONTROLLERS)

    def _unique(self, controllers: Sequence[str]) -> list[str]:
        seen: dict[str, str] = {}
        for c in controllers:
            seen.setdefault(self._dirs[c], c)
        return list(seen.values())

    def _path(self, controller: str, *parts: str) -> str:
        return os.path.join(self._dirs[controller], *parts)

    # -- groups -------------------------------------------------------------------------
    def create_root(self) -> None:
        """Create the manager's root group in every hierarchy; raise if cgroupfs is read-only."""
        try:
            for c in self._unique(V1_CONTROLLERS):
                os.makedirs(self._dirs[c], exist_ok=True)
            cpuset_parent = self._parents["cpuset"]
            write_text(self._path("cpuset", "cpuset.cpus"), read_text(os.path.join(cpuset_parent, "cpuset.cpus")).strip())
            write_text(self._path("cpuset", "cpuset.mems"), read_text(os.path.join(cpuset_parent, "cpuset.mems")).strip())
        except OSError as exc:
            self.remove_root()
            raise CgroupUnavailableError(
                f"cgroup v1: cannot create the manager's groups ({exc}); run as root or delegate "
                "the hierarchies, or pass unisolated=True for an explicitly unisolated dev mode"
            ) from exc

    def remove_root(self) -> None:
        for c in self._unique(V1_CONTROLLERS):
            rmdir_retry(self._dirs[c])

    def create_sandbox(self, sandbox: str, mem_bytes: int, pids_max: int, cpus: Sequence[int]) -> None:
        for c in self._unique(V1_CONTROLLERS):
            os.mkdir(self._path(c, sandbox))
        write_text(self._path("cpuset", sandbox, "cpuset.mems"), read_text(self._path("cpuset", "cpuset.mems")).strip())
        write_text(self._path("cpuset", sandbox, "cpuset.cpus"), format_cpus(cpus))
        write_text(self._path("cpu", sandbox, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
        self.set_limits(sandbox, mem_bytes, pids_max)
        self.create_slot(sandbox, INIT_SLOT)

    def remove_sandbox(self, sandbox: str) -> None:
        """Remove the sandbox's slots, then the sandbox group (tasks must be gone)."""
        for c in self._unique(V1_CONTROLLERS):
            base = self._path(c, sandbox)
            try:
                children = [e.path for e in os.scandir(base) if e.is_dir()]
            except FileNotFoundError:
                continue
            for child in children:
                rmdir_retry(child)
            rmdir_retry(base)

    def create_slot(self, sandbox: str, slot: str) -> None:
        for c in self._unique(_SLOT_CONTROLLERS):
            os.mkdir(self._path(c, sandbox, slot))

    def remove_slot(self, sandbox: str, slot: str) -> None:
        for c in self._unique(_SLOT_CONTROLLERS):
            rmdir_retry(self._path(c, sandbox, slot))

    def join_files(self, sandbox: str, slot: str) -> tuple[str, ...]:
        files = []
        for c in self._unique(V1_CONTROLLERS):
            parts = (sandbox, slot) if c in _SLOT_CONTROLLERS else (sandbox,)
            files.append(self._path(c, *parts, "cgroup.procs"))
        return tuple(files)

    # -- limits and grants --------------------------------------------------------------
    def set_grant(self, sandbox: str, cpus: Sequence[int] | None, quota_us: int | None) -> None:
        """Point the sandbox at ``cpus`` with ``quota_us`` per period (-1: unlimited);
        ``None`` leaves that setting alone."""
        if cpus is not None:
            write_text(self._path("cpuset", sandbox, "cpuset.cpus"), format_cpus(cpus))
        if quota_us is not None:
            write_text(self._path("cpu", sandbox, "cpu.cfs_quota_us"), str(max(quota_us, CPU_QUOTA_MIN_US) if quota_us >= 0 else -1))

    def set_limits(self, sandbox: str, mem_bytes: int, pids_max: int) -> None:
        write_text(self._path("memory", sandbox, "memory.limit_in_bytes"), str(mem_bytes))
        write_text(self._path("pids", sandbox, "pids.max"), str(pids_max))

    def freeze(self, sandbox: str) -> None:
        """Stop every task of the sandbox (asynchronous in v1: state may read FREEZING a while)."""
        write_text(self._path("freezer", sandbox, "freezer.state"), "FROZEN")

    def thaw(self, sandbox: str) -> None:
        write_text(self._path("freezer", sandbox, "freezer.state"), "THAWED")

    # -- tasks --------------------------------------------------------------------------
    def slot_pids(self, sandbox: str, slot: str) -> list[int]:
        return read_pids(self._path("freezer", sandbox, slot, "cgroup.procs"))

    def sandbox_pids(self, sandbox: str) -> list[int]:
        return sorted(set(self._tids(self._path("freezer", sandbox))))

    def _tids(self, base: str) -> list[int]:
        tids = read_pids(os.path.join(base, "tasks"))
        try:
            children = [e.path for e in os.scandir(base) if e.is_dir()]
        except FileNotFoundError:
            return tids
        for child in children:
            tids.extend(read_pids(os.path.join(child, "tasks")))
        return tids

    def kill_slot(self, sandbox: str, slot: str) -> None:
        """SIGKILL every task of one slot (frozen first so nothing forks meanwhile); waits."""
        self._kill_frozen(self._path("freezer", sandbox, slot))

    def kill_sandbox(self, sandbox: str) -> None:
        """SIGKILL every task of the sandbox and all its slots; waits until they are gone."""
        self._kill_frozen(self._path("freezer", sandbox))

    def _kill_frozen(self, base: str, timeout_s: float = 5.0) -> None:
        state = os.path.join(base, "freezer.state")
        try:
            write_text(state, "FROZEN")
        except FileNotFoundError:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            tids = self._tids(base)
            for tid in tids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(tid, signal.SIGKILL)
            write_text(state, "THAWED")
            if not tids or time.monotonic() > deadline:
                return
            time.sleep(0.002)
            write_text(state, "FROZEN")

    # -- accounting ---------------------------------------------------------------------
    def reset_slot_counters(self, sandbox: str, slot: str) -> None:
        write_text(self._path("cpuacct", sandbox, slot, "cpuacct.usage"), "0")
        write_text(self._path("memory", sandbox, slot, "memory.max_usage_in_bytes"), "0")

    def slot_cpu_ns(self, sandbox: str, slot: str) -> int:
        return read_int(self._path("cpuacct", sandbox, slot, "cpuacct.usage"))

    def slot_peak_bytes(self, sandbox: str, slot: str) -> int:
        return read_int(self._path("memory", sandbox, slot, "memory.max_usage_in_bytes"))

    def sandbox_memory_bytes(self, sandbox: str) -> int:
        return read_int(self._path("memory", sandbox, "memory.usage_in_bytes"))

    def sandbox_cpu_ns(self, sandbox: str) -> int:
        return read_int(self._path("cpuacct", sandbox, "cpuacct.usage"))

    def oom_kills(self, sandbox: str) -> int:
        """OOM kills in the sandbox. v1 counts a kill in the victim's own group
        (``memory.oom_control: oom_kill``), so the sandbox's and its slots' counts add up."""
        base = self._path("memory", sandbox)
        dirs = [base]
        with contextlib.suppress(FileNotFoundError):
            dirs += [e.path for e in os.scandir(base) if e.is_dir()]
        return sum(read_keyed(os.path.join(d, "memory.oom_control")).get("oom_kill", 0) for d in dirs)
