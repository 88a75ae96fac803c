"""Shell: GRPO groups on forks: the first trajectory of a group sets the task up, the others
start from a snapshot of its set-up env instead of repeating the setup.

Used by the mini-swe-agent environment (``group=`` key). In one process, members of a group
find each other here: the first to arrive is the leader (runs the setup, snapshots the env
as ``group:<key>``), the others wait for that snapshot and create their envs from it (a
fresh writable layer over it: no copy). A leader whose setup fails lets the waiters set up
on their own. Groups are kept until ``forget`` (or the process ends); the snapshot itself
is the server's, with its own lease.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class _Group:
    ready: threading.Event = field(default_factory=threading.Event)
    snapshot_id: str | None = None  # None once ready: the leader failed


class GroupBoard:
    """Who leads each group, and the snapshot its members start from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}

    def join(self, key: str) -> tuple[bool, _Group]:
        """(True: you lead and must ``publish``; False: wait on the group)."""
        with self._lock:
            group = self._groups.get(key)
            if group is not None:
                return False, group
            group = self._groups[key] = _Group()
            return True, group

    def publish(self, key: str, snapshot_id: str | None) -> None:
        with self._lock:
            group = self._groups[key]
        group.snapshot_id = snapshot_id
        group.ready.set()

    def wait(self, group: _Group, timeout_s: float) -> str | None:
        """The group's snapshot id, or None (the leader failed or took too long)."""
        return group.snapshot_id if group.ready.wait(timeout_s) else None

    def forget(self, key: str) -> None:
        with self._lock:
            self._groups.pop(key, None)


BOARD = GroupBoard()
