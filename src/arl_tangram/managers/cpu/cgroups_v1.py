"""Shell: the cgroup v1 driver (cpu, cpuacct, cpuset, memory, pids, freezer hierarchies).

Each controller may be its own mount (this host mounts cpu and cpuacct separately) and the
manager's own group may differ per controller (memory is nested here), so every controller
gets its own parent directory, found by ``cgroup_detect``. Sandboxes carry memory, pids and
the aggregate CPU quota; slots exist in every hierarchy but pids, so each action has its own
cpuset and quota (what it was granted, nothing more: ``nproc`` inside reports its cpus)
below the sandbox's, its own accounting, and can be frozen and killed alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence

from arl_tangram.managers.cpu.cgroup_driver import (
    CPU_PERIOD_US,
    CPU_QUOTA_MIN_US,
    INIT_SLOT,
    format_cpus,
    parse_cpus,
    root_shares,
)
from arl_tangram.managers.cpu.cgroup_fs import (
    read_int,
    read_keyed,
    read_pids,
    read_text,
    rmdir_retry,
    write_text,
)
from arl_tangram.managers.cpu.cgroup_kill import kill_frozen
from arl_tangram.managers.cpu.errors import CgroupUnavailableError
from arl_tangram.managers.cpu.memory_watch import V1GrantWatch

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "freezer")
_SLOT_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "freezer")


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
            cpus = read_text(os.path.join(cpuset_parent, "cpuset.cpus")).strip()
            write_text(self._path("cpuset", "cpuset.cpus"), cpus)
            write_text(self._path("cpuset", "cpuset.mems"), read_text(os.path.join(cpuset_parent, "cpuset.mems")).strip())
            write_text(self._path("cpu", "cpu.shares"), str(root_shares(len(parse_cpus(cpus)))))
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
        """A slot starts on all of the sandbox's cpus, unlimited below the sandbox's quota."""
        for c in self._unique(_SLOT_CONTROLLERS):
            os.mkdir(self._path(c, sandbox, slot))
        # a v1 cpuset child starts empty and refuses tasks until cpus and mems are set
        for key in ("cpuset.mems", "cpuset.cpus"):
            write_text(self._path("cpuset", sandbox, slot, key), read_text(self._path("cpuset", sandbox, key)).strip())
        write_text(self._path("cpu", sandbox, slot, "cpu.cfs_period_us"), str(CPU_PERIOD_US))

    def sibling_roots(self) -> list[str]:
        """Names of every manager root group (``arl-tangram-*``) beside ours, in any hierarchy."""
        names: set[str] = set()
        for c in self._unique(V1_CONTROLLERS):
            with contextlib.suppress(FileNotFoundError):
                names.update(e.name for e in os.scandir(self._parents[c]) if e.is_dir() and e.name.startswith("arl-tangram-"))
        return sorted(names)

    def list_sandboxes(self) -> list[str]:
        """Sandbox group names under this root in any hierarchy (for a sweep of a dead
        manager's groups): a root half removed (say, left only in ``memory``) must still be
        found, or every later sweep waits on its busy root and fails again."""
        names: set[str] = set()
        for c in self._unique(V1_CONTROLLERS):
            with contextlib.suppress(FileNotFoundError):
                names.update(e.name for e in os.scandir(self._dirs[c]) if e.is_dir() and e.name.startswith("sb-"))
        return sorted(names)

    def root_exists(self) -> bool:
        return any(os.path.isdir(self._dirs[c]) for c in self._unique(V1_CONTROLLERS))

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
            write_text(self._path("cpu", sandbox, "cpu.cfs_quota_us"), _quota(quota_us))

    def set_slot_grant(self, sandbox: str, slot: str, cpus: Sequence[int] | None, quota_us: int | None) -> None:
        """One action's own cpuset and quota (-1: unlimited below the sandbox's quota)."""
        if cpus is not None:
            write_text(self._path("cpuset", sandbox, slot, "cpuset.cpus"), format_cpus(cpus))
        if quota_us is not None:
            write_text(self._path("cpu", sandbox, slot, "cpu.cfs_quota_us"), _quota(quota_us))

    def set_shares(self, sandbox: str, shares: int) -> None:
        """CFS weight of the sandbox against its siblings (a Burstable holding's request)."""
        write_text(self._path("cpu", sandbox, "cpu.shares"), str(max(2, shares)))

    def set_limits(self, sandbox: str, mem_bytes: int, pids_max: int) -> None:
        write_text(self._path("memory", sandbox, "memory.limit_in_bytes"), str(mem_bytes))
        write_text(self._path("pids", sandbox, "pids.max"), str(pids_max))

    # -- memory per action (memory_watch) -----------------------------------------------
    def set_memory_limit(self, sandbox: str, limit_bytes: int) -> None:
        """The sandbox's hard limit: its own ceiling, or footprint + grants for a run
        without pause-and-grow (``memory_pause = false``: over it the kernel OOM-kills, and
        fails a tmpfs write with ENOMEM)."""
        write_text(self._path("memory", sandbox, "memory.limit_in_bytes"), str(limit_bytes))

    def set_memory_pause(self, sandbox: str, on: bool) -> None:
        """On: tasks over the limit wait in the kernel; off: the kernel OOM-kills them (turning
        it off while they wait is how an action is ended ``oom_killed``)."""
        write_text(self._path("memory", sandbox, "memory.oom_control"), "1" if on else "0")

    def open_memory_watch(self, sandbox: str, grant_bytes: int, ceiling_bytes: int) -> V1GrantWatch:
        """Arm a grant softly: the hard limit at ``ceiling_bytes``, a usage threshold at
        ``grant_bytes`` over which the action slots are frozen (``memory_watch``)."""
        return V1GrantWatch(self._path("memory", sandbox), self._path("freezer", sandbox), INIT_SLOT, grant_bytes, ceiling_bytes)

    def sandbox_footprint_bytes(self, sandbox: str) -> int:
        """What the sandbox holds that reclaim cannot take back: resident anonymous memory and
        shmem (its tmpfs pages: a file left in /tmp or an image env's writable upper).

        ``memory.stat`` is flushed lazily (kernel 6.x: up to ~2 s behind), so right after a
        spike exits it may still count the freed pages; the exact page counter
        (``memory.usage_in_bytes``, cache included: it only bounds from above) caps it. A
        stale spike charged as footprint would starve the node's next grants."""
        stat = read_keyed(self._path("memory", sandbox, "memory.stat"))
        held = stat.get("total_rss", 0) + stat.get("total_shmem", 0)
        return min(held, read_int(self._path("memory", sandbox, "memory.usage_in_bytes"), held))

    def limit_root_memory(self, limit_bytes: int) -> bool:
        """Cap the root group's memory (every sandbox under it together): ``False``, and
        nothing written, where the hierarchy does not account children in their parent
        (``memory.use_hierarchy`` 0), since there the cap would not bound them."""
        if read_text(self._path("memory", "memory.use_hierarchy")).strip() != "1":
            return False
        write_text(self._path("memory", "memory.limit_in_bytes"), str(limit_bytes))
        return True

    def root_memory_limit_bytes(self) -> int | None:
        return read_int(self._path("memory", "memory.limit_in_bytes"))

    def memory_dirs(self) -> tuple[str, ...]:
        return (self._dirs["memory"], self._parents["memory"])

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

    def sandbox_unreaped(self, sandbox: str) -> int:
        listed = len(self._tids(self._path("freezer", sandbox)))
        return max(0, read_int(self._path("pids", sandbox, "pids.current")) - listed)

    def _tids(self, base: str) -> list[int]:
        tids = read_pids(os.path.join(base, "tasks"))
        for child in _subdirs(base):
            tids.extend(read_pids(os.path.join(child, "tasks")))
        return tids

    def kill_slot(self, sandbox: str, slot: str, *, spare_host: bool = True) -> int:
        """SIGKILL every task of one slot (launchers spared, see ``cgroup_kill``); returns
        how many are left after the bounded retries (0 = all gone)."""
        return self._kill((sandbox, slot), spare_host)

    def kill_sandbox(self, sandbox: str, *, spare_host: bool = True) -> int:
        """SIGKILL every task of the sandbox and all its slots; returns how many are left."""
        return self._kill((sandbox,), spare_host)

    def _kill(self, parts: tuple[str, ...], spare_host: bool) -> int:
        base = self._path("freezer", *parts)

        def unlimit() -> None:
            # a slot's kill runs under the sandbox's current grant (the caller keeps one
            # applied); a sandbox's kill lifts every quota: all tasks must get CPU to exit
            write_text(self._path("cpu", *parts, "cpu.cfs_quota_us"), "-1")
            if len(parts) == 1:
                for slot in _subdirs(self._path("cpu", *parts)):
                    with contextlib.suppress(FileNotFoundError):
                        write_text(os.path.join(slot, "cpu.cfs_quota_us"), "-1")

        def freeze(on: bool) -> None:
            write_text(os.path.join(base, "freezer.state"), "FROZEN" if on else "THAWED")
            if not on and len(parts) == 1:
                # a slot a memory pause froze keeps its tasks frozen (and unkillable) under a
                # thawed sandbox: thaw the slots too, so that what was signalled exits
                for slot in _subdirs(base):
                    with contextlib.suppress(FileNotFoundError):
                        write_text(os.path.join(slot, "freezer.state"), "THAWED")

        return kill_frozen(lambda: self._tids(base), freeze, unlimit, spare_host=spare_host)

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

    def slot_oom_kills(self, sandbox: str, slot: str) -> int:
        """OOM kills of the slot's own tasks (one file: an action's victims are its slot's)."""
        return read_keyed(self._path("memory", sandbox, slot, "memory.oom_control")).get("oom_kill", 0)


def _quota(quota_us: int) -> str:
    return str(max(quota_us, CPU_QUOTA_MIN_US)) if quota_us >= 0 else "-1"


def _subdirs(base: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(base) if e.is_dir()]
    except FileNotFoundError:
        return []
