"""Shell: one sandbox: a long-lived bubblewrap init inside its own cgroups, its state
machine, its grants (Allocate-on-Execution) and its accounting slots.

Who calls: only ``CpuManager``, holding ``Sandbox.lock`` around every method that changes
state (``grant``/``reclaim``/slot bookkeeping); ``start`` and ``destroy`` run before the
sandbox is published / after it is unpublished.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import select
import subprocess
import threading
import time

from arl_tangram.managers.cpu import reaper
from arl_tangram.managers.cpu.cgroup_driver import (
    CPU_PERIOD_US,
    CPU_QUOTA_MIN_US,
    INIT_SLOT,
    CgroupDriver,
)
from arl_tangram.managers.cpu.cgroup_null import kill_tree
from arl_tangram.managers.cpu.errors import (
    CpuManagerError,
    InvalidTransitionError,
    SandboxDeadError,
)
from arl_tangram.managers.cpu.launch import HOST_ENV, SandboxLayout, bwrap_argv, join_then_exec

INIT_ARGV = ("/usr/bin/sleep", "infinity")
_START_TIMEOUT_S = 10.0


class SandboxState(enum.StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    ACTIVE = "active"
    DEAD = "dead"
    DESTROYED = "destroyed"


S = SandboxState
_TRANSITIONS: dict[tuple[SandboxState, SandboxState], str] = {
    (S.STARTING, S.IDLE): "init is up; frozen at zero CPU until the first grant",
    (S.STARTING, S.DEAD): "init failed to start",
    (S.IDLE, S.ACTIVE): "first grant: quota and cpuset raised, thawed",
    (S.ACTIVE, S.ACTIVE): "a grant added or released while others still run",
    (S.ACTIVE, S.IDLE): "last grant reclaimed: quota to the minimum, frozen",
    (S.IDLE, S.DEAD): "init found gone (killed from outside)",
    (S.ACTIVE, S.DEAD): "init found gone while actions ran",
    (S.STARTING, S.DESTROYED): "start aborted",
    (S.IDLE, S.DESTROYED): "destroyed by the caller",
    (S.ACTIVE, S.DESTROYED): "destroyed by the caller; running actions are killed",
    (S.DEAD, S.DESTROYED): "a dead sandbox's leftovers removed",
}


class Sandbox:
    """A stateful sandbox. ``group`` is its cgroup name; ``init_pid`` the host pid of the
    bubblewrap pid-1 whose namespaces every action enters."""

    def __init__(self, sandbox_id: str, driver: CgroupDriver, layout: SandboxLayout, all_cpus: tuple[int, ...]) -> None:
        self.sandbox_id = sandbox_id
        self.group = f"sb-{sandbox_id}"
        self.layout = layout
        self.lock = threading.Lock()
        self.state = SandboxState.STARTING
        self.init_pid = -1
        self.dead_reason: str | None = None
        self._driver = driver
        self._all_cpus = all_cpus
        self._proc: subprocess.Popen[bytes] | None = None
        self._grants: list[tuple[tuple[int, ...], int]] = []
        self._applied: tuple[tuple[int, ...], int] | None = None  # (cpuset, quota) in the cgroup
        self._slots: dict[str, bool] = {}  # slot name -> in use by a running action
        self._next_slot = 0

    # -- state machine --------------------------------------------------------------------
    def _move(self, to: SandboxState) -> None:
        if (self.state, to) not in _TRANSITIONS:
            raise InvalidTransitionError(f"sandbox {self.sandbox_id}: {self.state} -> {to} is not a valid transition")
        self.state = to

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, mem_bytes: int, pids_max: int) -> None:
        """Create the cgroups, start the init in them, wait until its mounts are ready, freeze."""
        self._driver.create_sandbox(self.group, mem_bytes, pids_max, self._all_cpus)
        self._set(self._all_cpus, -1)
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            argv = join_then_exec(self._driver.join_files(self.group, INIT_SLOT), bwrap_argv(self.layout, w, INIT_ARGV))
            self._proc = reaper.spawn(
                argv, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=HOST_ENV,
            )  # fmt: skip
            os.close(w)
            w = -1
            self.init_pid = self._read_child_pid(r)
            self._wait_ready()
        except BaseException:
            self._move(SandboxState.DEAD)
            raise
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
            if self._proc is not None and self._proc.stderr is not None:
                self._proc.stderr.close()  # only start errors matter; never block the init
        self.reclaim_all()
        self._move(SandboxState.IDLE)

    def _read_child_pid(self, fd: int) -> int:
        data = b""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                break
            data += chunk
            with contextlib.suppress(ValueError):
                return int(json.loads(data)["child-pid"])
        raise CpuManagerError(f"sandbox {self.sandbox_id}: bubblewrap did not start: {self._start_error()}")

    def _wait_ready(self) -> None:
        """bwrap reports the pid before the mounts are done; its pid 1 forks the init command
        only after setup, so a child of pid 1 means the sandbox is ready to be entered."""
        children = f"/proc/{self.init_pid}/task/{self.init_pid}/children"
        deadline = time.monotonic() + _START_TIMEOUT_S
        delay = 0.0002
        while time.monotonic() < deadline:
            try:
                with open(children, encoding="ascii") as f:
                    if f.read().strip():
                        return
            except FileNotFoundError:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        raise CpuManagerError(f"sandbox {self.sandbox_id}: init did not become ready: {self._start_error()}")

    def _start_error(self) -> str:
        proc = self._proc
        if proc is None:
            return "not spawned"
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        text = b""
        if proc.stderr is not None and proc.poll() is not None:
            with contextlib.suppress(OSError):
                text = proc.stderr.read() or b""
        return f"exit status {proc.returncode}: {text.decode(errors='replace').strip() or 'no message'}"

    def alive(self) -> bool:
        """Whether the init still runs; marks the sandbox DEAD (once) when it does not."""
        if self.state in (SandboxState.DEAD, SandboxState.DESTROYED):
            return False
        proc = self._proc
        gone = proc is None or proc.poll() is not None or not os.path.exists(f"/proc/{self.init_pid}")
        if gone and self.state in (SandboxState.IDLE, SandboxState.ACTIVE):
            self.dead_reason = f"init (pid {self.init_pid}) exited with status {proc.returncode if proc else None}"
            self._move(SandboxState.DEAD)
        return not gone

    def ensure_alive(self) -> None:
        if not self.alive():
            raise SandboxDeadError(f"sandbox {self.sandbox_id} is {self.state}: {self.dead_reason or 'gone'}")

    def destroy(self) -> None:
        """Kill every process of the sandbox, reap its init, remove its cgroups. Idempotent."""
        if self.state is SandboxState.DESTROYED:
            return
        self._driver.kill_sandbox(self.group)
        proc = self._proc
        if self._driver.version == 0 and proc is not None and proc.poll() is None:
            kill_tree(proc.pid)  # no cgroup to kill through (unisolated mode)
            if self.init_pid > 0:
                kill_tree(self.init_pid)
        if proc is not None:
            # the pid-1 finishes exiting only once the zombies of its namespace that we
            # adopted (e.g. a killed session's shell) are reaped
            deadline = time.monotonic() + 5.0
            while proc.poll() is None and time.monotonic() < deadline:
                reaper.reap_orphans()
                time.sleep(0.001)
            reaper.release(proc)
        self._reap_init()
        self._driver.remove_sandbox(self.group)
        self._grants.clear()
        self._move(SandboxState.DESTROYED)

    def _reap_init(self) -> None:
        """The init was adopted by us (the subreaper) when its bwrap monitor died: reap it."""
        deadline = time.monotonic() + 2.0
        while self.init_pid > 0 and time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.init_pid}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                return
            if int(fields[1]) != os.getpid():
                return  # not (or no longer) ours: its parent reaps it
            if fields[0] == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.init_pid, os.WNOHANG)
                return
            time.sleep(0.005)

    # -- Allocate-on-Execution ----------------------------------------------------------------
    def grant(self, cpus: tuple[int, ...], cores: int) -> None:
        """Add one action's grant: cpuset = union of live grants, quota = their cores; thaw."""
        self.ensure_alive()
        self._grants.append((cpus, cores))
        self._apply()
        if len(self._grants) == 1:
            self._driver.thaw(self.group)
        self._move(SandboxState.ACTIVE)

    def reclaim(self, cpus: tuple[int, ...], cores: int) -> None:
        """Remove one grant (idempotent per grant); the last one freezes the sandbox at zero CPU."""
        with contextlib.suppress(ValueError):
            self._grants.remove((cpus, cores))
        if self.state is not SandboxState.ACTIVE:
            return
        if self._grants:
            self._apply()
            self._move(SandboxState.ACTIVE)
        else:
            self.reclaim_all()
            self._move(SandboxState.IDLE)

    def reclaim_all(self) -> None:
        """Minimum quota and frozen; the cpuset is left as it was (frozen tasks use none)."""
        cpus = self._applied[0] if self._applied else self._all_cpus
        self._set(cpus, CPU_QUOTA_MIN_US)
        self._driver.freeze(self.group)

    def _apply(self) -> None:
        cpus = tuple(sorted({c for g, _ in self._grants for c in g}))
        self._set(cpus, sum(n for _, n in self._grants) * CPU_PERIOD_US)

    def _set(self, cpus: tuple[int, ...], quota_us: int) -> None:
        """Write only what changed: each cgroup write costs tens of microseconds."""
        old_cpus, old_quota = self._applied or ((), -2)
        self._driver.set_grant(self.group, cpus if cpus != old_cpus else None, quota_us if quota_us != old_quota else None)
        self._applied = (cpus, quota_us)

    @property
    def granted_cores(self) -> int:
        return sum(n for _, n in self._grants)

    # -- slots ----------------------------------------------------------------------------
    def acquire_slot(self) -> str:
        """An accounting slot with no task in it (reused when possible), marked in use."""
        for name in sorted(self._slots):
            if not self._slots[name] and not self._driver.slot_pids(self.group, name):
                self._slots[name] = True
                return name
        name = f"a{self._next_slot}"
        self._next_slot += 1
        self._driver.create_slot(self.group, name)
        self._slots[name] = True
        return name

    def release_slot(self, name: str) -> None:
        self._slots[name] = False

    def slot_join_files(self, slot: str) -> tuple[str, ...]:
        return self._driver.join_files(self.group, slot)

    @property
    def root_dir(self) -> str:
        """The sandbox's root as the host sees it (valid while the init lives)."""
        return f"/proc/{self.init_pid}/root"
