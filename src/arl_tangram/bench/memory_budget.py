"""Shell: a memory budget for a whole benchmark run: one cgroup v1 memory group the bench's
CPU manager nests its sandboxes under, so a run does not depend on the host's other work.

The bench process joins the group only while its manager is created (the driver finds its
memory parent in ``/proc/self/cgroup``), then goes back: sandboxes are charged to the
budget, the controller is not. ``peak_bytes`` is the group's maximum usage.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from arl_tangram.managers.cpu.cgroup_fs import read_int, write_text

MEMORY_ROOT = "/sys/fs/cgroup/memory"


def own_memory_dir() -> str:
    """This process's cgroup v1 memory directory (``/proc/self/cgroup``)."""
    with open("/proc/self/cgroup", encoding="ascii") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join(MEMORY_ROOT, path.lstrip("/"))
    raise RuntimeError("bench memory: needs the cgroup v1 memory controller (this host's layout)")


class Budget:
    """A memory group of ``limit_bytes`` beside this process's own group. Not
    ``arl-tangram-*``: other managers' sweeps of dead roots must never take it for one."""

    def __init__(self, limit_bytes: int) -> None:
        self.parent = own_memory_dir()
        self.path = os.path.join(self.parent, f"tangram-membudget-{os.getpid()}")
        self.limit_bytes = limit_bytes
        os.mkdir(self.path)
        write_text(os.path.join(self.path, "memory.limit_in_bytes"), str(limit_bytes))

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """This process inside the budget for the block (while its manager is created)."""
        write_text(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))
        try:
            yield
        finally:
            write_text(os.path.join(self.parent, "cgroup.procs"), str(os.getpid()))

    def peak_bytes(self) -> int:
        return read_int(os.path.join(self.path, "memory.max_usage_in_bytes"))

    def oom_kills(self) -> int:
        with open(os.path.join(self.path, "memory.oom_control"), encoding="ascii") as f:
            fields = dict(line.split() for line in f if line.strip())
        return int(fields.get("oom_kill", 0))

    def remove(self) -> None:
        deadline = time.monotonic() + 5.0
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
