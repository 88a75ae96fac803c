"""Shell: the cgroup v2 driver (one unified hierarchy: cpu.max, cpuset.cpus, memory.max,
pids.max, cgroup.freeze, cgroup.kill).

v2 forbids tasks in a group whose children have controllers enabled, so the sandbox's init
lives in the ``init`` slot like any action. The manager's parent group must be delegated to
it (root, or a systemd scope with ``Delegate=yes``); otherwise creation fails with a message.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Sequence

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
from arl_tangram.managers.cpu.memory_watch import V2HighWatch

V2_CONTROLLERS = ("cpu", "cpuset", "memory", "pids")


class CgroupV2Driver:
    """cgroup v2 implementation of ``CgroupDriver`` rooted at ``parent/root_name``."""

    version = 2

    def __init__(self, parent: str, root_name: str) -> None:
        self.root_name = root_name
        self._parent = parent
        self._root = os.path.join(parent, root_name)
        # per-slot baseline of cpu.stat usage_usec, since v2 has no writable cpu counter
        self._cpu_base_us: dict[tuple[str, str], int] = {}
        # per-slot open memory.peak fd: writing resets the peak for reads through that fd
        self._peak_fds: dict[tuple[str, str], int] = {}

    def describe(self) -> str:
        return f"cgroup v2: {self._root}"

    def _path(self, *parts: str) -> str:
        return os.path.join(self._root, *parts)

    def _enable(self, group_dir: str) -> None:
        write_text(os.path.join(group_dir, "cgroup.subtree_control"), " ".join("+" + c for c in V2_CONTROLLERS))

    # -- groups -------------------------------------------------------------------------
    def create_root(self) -> None:
        try:
            available = read_text(os.path.join(self._parent, "cgroup.controllers")).split()
            missing = [c for c in V2_CONTROLLERS if c not in available]
            if missing:
                raise CgroupUnavailableError(f"cgroup v2: controllers not delegated to {self._parent}: {', '.join(missing)}")
            self._enable(self._parent)
            os.makedirs(self._root, exist_ok=True)
            self._enable(self._root)
            write_text(os.path.join(self._root, "cpu.weight"), _weight(root_shares(self._num_cpus())))
        except OSError as exc:
            hint = " (the parent holds tasks; move them to a leaf group)" if exc.errno == errno.EBUSY else ""
            raise CgroupUnavailableError(
                f"cgroup v2: cannot create the manager's groups under {self._parent}: {exc}{hint}; "
                "run as root with a delegated subtree, or pass unisolated=True for a dev mode"
            ) from exc

    def _num_cpus(self) -> int:
        """The cpus the parent grants (its effective cpuset; this process's affinity if the
        parent does not say)."""
        try:
            return len(parse_cpus(read_text(os.path.join(self._parent, "cpuset.cpus.effective")).strip()))
        except (OSError, ValueError):
            return len(os.sched_getaffinity(0))

    def remove_root(self) -> None:
        rmdir_retry(self._root)

    def create_sandbox(self, sandbox: str, mem_bytes: int, pids_max: int, cpus: Sequence[int]) -> None:
        os.mkdir(self._path(sandbox))
        self._enable(self._path(sandbox))
        write_text(self._path(sandbox, "cpuset.cpus"), format_cpus(cpus))
        write_text(self._path(sandbox, "cpu.max"), f"{CPU_QUOTA_MIN_US} {CPU_PERIOD_US}")
        self.set_limits(sandbox, mem_bytes, pids_max)
        self.create_slot(sandbox, INIT_SLOT)

    def remove_sandbox(self, sandbox: str) -> None:
        base = self._path(sandbox)
        try:
            children = sorted(e.name for e in os.scandir(base) if e.is_dir())
        except FileNotFoundError:
            return
        for child in children:
            self.remove_slot(sandbox, child)
        rmdir_retry(base)

    def create_slot(self, sandbox: str, slot: str) -> None:
        os.mkdir(self._path(sandbox, slot))

    def remove_slot(self, sandbox: str, slot: str) -> None:
        fd = self._peak_fds.pop((sandbox, slot), None)
        if fd is not None:
            os.close(fd)
        self._cpu_base_us.pop((sandbox, slot), None)
        rmdir_retry(self._path(sandbox, slot))

    def join_files(self, sandbox: str, slot: str) -> tuple[str, ...]:
        return (self._path(sandbox, slot, "cgroup.procs"),)

    def sibling_roots(self) -> list[str]:
        """Names of every manager root group (``arl-tangram-*``) beside ours."""
        with contextlib.suppress(FileNotFoundError):
            return sorted(e.name for e in os.scandir(self._parent) if e.is_dir() and e.name.startswith("arl-tangram-"))
        return []

    def list_sandboxes(self) -> list[str]:
        with contextlib.suppress(FileNotFoundError):
            return sorted(e.name for e in os.scandir(self._root) if e.is_dir() and e.name.startswith("sb-"))
        return []

    def root_exists(self) -> bool:
        return os.path.isdir(self._root)

    # -- limits and grants --------------------------------------------------------------
    def set_grant(self, sandbox: str, cpus: Sequence[int] | None, quota_us: int | None) -> None:
        """As in v1: ``None`` leaves that setting alone."""
        if cpus is not None:
            write_text(self._path(sandbox, "cpuset.cpus"), format_cpus(cpus))
        if quota_us is not None:
            write_text(self._path(sandbox, "cpu.max"), _cpu_max(quota_us))

    def set_slot_grant(self, sandbox: str, slot: str, cpus: Sequence[int] | None, quota_us: int | None) -> None:
        """One action's own cpuset and quota (-1: unlimited below the sandbox's quota)."""
        if cpus is not None:
            write_text(self._path(sandbox, slot, "cpuset.cpus"), format_cpus(cpus))
        if quota_us is not None:
            write_text(self._path(sandbox, slot, "cpu.max"), _cpu_max(quota_us))

    def set_shares(self, sandbox: str, shares: int) -> None:
        """``cpu.weight`` from v1-style shares (1024 = weight 100)."""
        write_text(self._path(sandbox, "cpu.weight"), _weight(shares))

    def set_limits(self, sandbox: str, mem_bytes: int, pids_max: int) -> None:
        write_text(self._path(sandbox, "memory.max"), str(mem_bytes))
        if os.path.exists(self._path(sandbox, "memory.swap.max")):
            write_text(self._path(sandbox, "memory.swap.max"), "0")
        write_text(self._path(sandbox, "pids.max"), str(pids_max))

    # -- memory per action (memory_watch) -----------------------------------------------
    def set_memory_limit(self, sandbox: str, limit_bytes: int) -> None:
        """A run's grant as ``memory.high`` (throttled over it, never failed); ``memory.max``
        stays the env's limit. The env's own limit when its runs end."""
        write_text(self._path(sandbox, "memory.high"), str(limit_bytes))

    def set_memory_pause(self, sandbox: str, on: bool) -> None:
        """Nothing to switch on v2: ``memory.high`` throttles instead of killing, and a pause
        ends as an OOM kill through its watch (``V2HighWatch.end_as_oom``)."""

    def open_memory_watch(self, sandbox: str, grant_bytes: int, ceiling_bytes: int) -> V2HighWatch:
        return V2HighWatch(self._path(sandbox), grant_bytes, ceiling_bytes)

    def sandbox_footprint_bytes(self, sandbox: str) -> int:
        """Resident anonymous memory and shmem, capped by the exact ``memory.current`` (the
        stat is flushed lazily: see ``CgroupV1Driver.sandbox_footprint_bytes``)."""
        stat = read_keyed(self._path(sandbox, "memory.stat"))
        held = stat.get("anon", 0) + stat.get("shmem", 0)
        return min(held, read_int(self._path(sandbox, "memory.current"), held))

    def limit_root_memory(self, limit_bytes: int) -> bool:
        """Cap the root group's memory (v2 always accounts children in their parent)."""
        write_text(self._path("memory.max"), str(limit_bytes))
        return True

    def root_memory_limit_bytes(self) -> int | None:
        text = read_text(self._path("memory.max")).strip()
        return None if text == "max" else int(text)

    def memory_dirs(self) -> tuple[str, ...]:
        return (self._root, os.path.dirname(self._root))

    def freeze(self, sandbox: str) -> None:
        write_text(self._path(sandbox, "cgroup.freeze"), "1")

    def thaw(self, sandbox: str) -> None:
        write_text(self._path(sandbox, "cgroup.freeze"), "0")

    # -- tasks --------------------------------------------------------------------------
    def slot_pids(self, sandbox: str, slot: str) -> list[int]:
        return read_pids(self._path(sandbox, slot, "cgroup.procs"))

    def sandbox_pids(self, sandbox: str) -> list[int]:
        return sorted(set(self._listed(sandbox, "cgroup.procs")))

    def sandbox_unreaped(self, sandbox: str) -> int:
        listed = len(self._listed(sandbox, "cgroup.threads"))
        return max(0, read_int(self._path(sandbox, "pids.current")) - listed)

    def _listed(self, sandbox: str, name: str) -> list[int]:
        """The ids in ``name`` (``cgroup.procs`` or ``cgroup.threads``) of the sandbox's
        group and of its slots."""
        base = self._path(sandbox)
        ids = read_pids(os.path.join(base, name))
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(base):
                if entry.is_dir():
                    ids.extend(read_pids(os.path.join(entry.path, name)))
        return ids

    def kill_slot(self, sandbox: str, slot: str, *, spare_host: bool = True) -> int:
        """As in v1 (freeze, signal, thaw unlimited; launchers spared); returns what is left.
        ``cgroup.kill`` is not used: it cannot spare the launchers."""
        return self._kill((sandbox, slot), lambda: self.slot_pids(sandbox, slot), spare_host)

    def kill_sandbox(self, sandbox: str, *, spare_host: bool = True) -> int:
        return self._kill((sandbox,), lambda: self.sandbox_pids(sandbox), spare_host)

    def _kill(self, parts: tuple[str, ...], pids: Callable[[], list[int]], spare_host: bool) -> int:
        def unlimit() -> None:
            write_text(self._path(*parts, "cpu.max"), f"max {CPU_PERIOD_US}")
            if len(parts) == 1:
                for entry in list(os.scandir(self._path(*parts))):
                    if entry.is_dir():
                        with contextlib.suppress(FileNotFoundError):
                            write_text(os.path.join(entry.path, "cpu.max"), f"max {CPU_PERIOD_US}")

        def freeze(on: bool) -> None:
            write_text(self._path(*parts, "cgroup.freeze"), "1" if on else "0")

        return kill_frozen(pids, freeze, unlimit, spare_host=spare_host)

    # -- accounting ---------------------------------------------------------------------
    def reset_slot_counters(self, sandbox: str, slot: str) -> None:
        key = (sandbox, slot)
        self._cpu_base_us[key] = read_keyed(self._path(sandbox, slot, "cpu.stat")).get("usage_usec", 0)
        fd = self._peak_fds.get(key)
        if fd is None:
            try:
                fd = os.open(self._path(sandbox, slot, "memory.peak"), os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                return
            self._peak_fds[key] = fd
        with contextlib.suppress(OSError):  # kernels < 6.12 cannot reset; the peak is the slot's
            os.pwrite(fd, b"reset\n", 0)

    def slot_cpu_ns(self, sandbox: str, slot: str) -> int:
        used = read_keyed(self._path(sandbox, slot, "cpu.stat")).get("usage_usec", 0)
        return max(0, used - self._cpu_base_us.get((sandbox, slot), 0)) * 1000

    def slot_peak_bytes(self, sandbox: str, slot: str) -> int:
        fd = self._peak_fds.get((sandbox, slot))
        if fd is not None:
            text = os.pread(fd, 64, 0).decode().strip()
            if text.isdigit():
                return int(text)
        return read_int(self._path(sandbox, slot, "memory.peak"))

    def sandbox_memory_bytes(self, sandbox: str) -> int:
        return read_int(self._path(sandbox, "memory.current"))

    def sandbox_cpu_ns(self, sandbox: str) -> int:
        return read_keyed(self._path(sandbox, "cpu.stat")).get("usage_usec", 0) * 1000

    def oom_kills(self, sandbox: str) -> int:
        """Hierarchical ``oom_kill`` count of the sandbox (``memory.events``)."""
        return read_keyed(self._path(sandbox, "memory.events")).get("oom_kill", 0)

    def slot_oom_kills(self, sandbox: str, slot: str) -> int:
        """Hierarchical ``oom_kill`` count of one slot (its ``memory.events``)."""
        return read_keyed(self._path(sandbox, slot, "memory.events")).get("oom_kill", 0)


def _cpu_max(quota_us: int) -> str:
    quota = "max" if quota_us < 0 else str(max(quota_us, CPU_QUOTA_MIN_US))
    return f"{quota} {CPU_PERIOD_US}"


def _weight(shares: int) -> str:
    """v2 ``cpu.weight`` for v1-style ``shares`` (1024 = weight 100)."""
    return str(min(10_000, max(1, shares * 100 // 1024)))
