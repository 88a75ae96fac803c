"""Shell: the no-cgroup driver behind the explicit ``unisolated=True`` development mode.

Namespaces still isolate the sandbox, but nothing limits, accounts for or freezes it:
grants are bookkeeping only and a timeout kills the action's processes found through the
process tree, which a daemonised child escapes. Never chosen silently.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence


class NullCgroupDriver:
    version = 0

    def __init__(self, root_name: str) -> None:
        self.root_name = root_name
        self._slot_roots: dict[tuple[str, str], set[int]] = {}

    def describe(self) -> str:
        return "UNISOLATED: no cgroups (no limits, no accounting, no freezing)"

    def create_root(self) -> None: ...
    def remove_root(self) -> None: ...
    def create_sandbox(self, sandbox: str, mem_bytes: int, pids_max: int, cpus: Sequence[int]) -> None: ...
    def remove_sandbox(self, sandbox: str) -> None: ...
    def create_slot(self, sandbox: str, slot: str) -> None: ...
    def remove_slot(self, sandbox: str, slot: str) -> None: ...

    def join_files(self, sandbox: str, slot: str) -> tuple[str, ...]:
        return ()

    def set_grant(self, sandbox: str, cpus: Sequence[int] | None, quota_us: int | None) -> None: ...
    def set_slot_grant(self, sandbox: str, slot: str, cpus: Sequence[int] | None, quota_us: int | None) -> None: ...
    def set_shares(self, sandbox: str, shares: int) -> None: ...

    def sibling_roots(self) -> list[str]:
        return []

    def list_sandboxes(self) -> list[str]:
        return []

    def root_exists(self) -> bool:
        return False
    def set_limits(self, sandbox: str, mem_bytes: int, pids_max: int) -> None: ...
    def freeze(self, sandbox: str) -> None: ...
    def thaw(self, sandbox: str) -> None: ...

    def slot_pids(self, sandbox: str, slot: str) -> list[int]:
        return []

    def sandbox_pids(self, sandbox: str) -> list[int]:
        return []

    def sandbox_unreaped(self, sandbox: str) -> int:
        return 0

    def kill_slot(self, sandbox: str, slot: str, *, spare_host: bool = True) -> int:
        """Best effort without cgroups: nothing identifies the slot's processes."""
        return 0

    def kill_sandbox(self, sandbox: str, *, spare_host: bool = True) -> int:
        return 0
    def reset_slot_counters(self, sandbox: str, slot: str) -> None: ...

    def slot_cpu_ns(self, sandbox: str, slot: str) -> int:
        return 0

    def slot_peak_bytes(self, sandbox: str, slot: str) -> int:
        return 0

    def set_memory_limit(self, sandbox: str, limit_bytes: int) -> None: ...
    def set_memory_pause(self, sandbox: str, on: bool) -> None: ...

    def open_memory_watch(self, sandbox: str, grant_bytes: int, ceiling_bytes: int) -> None:
        return None  # unisolated: nothing is limited, nothing pauses

    def sandbox_footprint_bytes(self, sandbox: str) -> int:
        return 0

    def limit_root_memory(self, limit_bytes: int) -> bool:
        return False  # no root group: the scheduler alone keeps to a budget

    def root_memory_limit_bytes(self) -> int | None:
        return None

    def memory_dirs(self) -> tuple[str, ...]:
        return ()

    def sandbox_memory_bytes(self, sandbox: str) -> int:
        return 0

    def sandbox_cpu_ns(self, sandbox: str) -> int:
        return 0

    def oom_kills(self, sandbox: str) -> int:
        return 0

    def slot_oom_kills(self, sandbox: str, slot: str) -> int:
        return 0


def kill_tree(pid: int, *, spare_root: bool = False) -> None:
    """SIGKILL ``pid`` and its descendants (found via /proc children lists), parents before
    their children (a shell that saw its child killed would run its next command); with
    ``spare_root`` only the descendants (the root, a launcher, then reaps its child)."""
    order, seen = [pid], {pid}
    for p in order:  # grows while walked: breadth first
        with contextlib.suppress(OSError), open(f"/proc/{p}/task/{p}/children", encoding="ascii") as f:
            kids = [int(c) for c in f.read().split() if int(c) not in seen]
        seen.update(kids)
        order.extend(kids)
    for p in order[1:] if spare_root else order:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
