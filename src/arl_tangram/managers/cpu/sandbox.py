"""Shell: one sandbox: a long-lived bubblewrap init inside its own cgroups, its state
machine, its holding, and its slots (one child cgroup per running action, session or kept
background job, each with exactly its own cpuset and quota: Allocate-on-Execution).

Concurrency: every method takes ``Sandbox.lock`` (a per-entity lock, never the manager's)
around state changes and the cgroup writes that go with them; ``destroy`` marks the sandbox
DESTROYING under the lock and does the slow kill outside it, so calls racing a destroy see
a defined state (``is_destroying``) instead of half-removed cgroups.
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from arl_tangram.managers.cpu.cgroup_driver import CPU_QUOTA_MIN_US, INIT_SLOT, CgroupDriver
from arl_tangram.managers.cpu.cgroup_null import kill_tree
from arl_tangram.managers.cpu.errors import (
    InvalidRequestError,
    InvalidTransitionError,
    SandboxDeadError,
)
from arl_tangram.managers.cpu.grants import quota_us
from arl_tangram.managers.cpu.launch import SandboxLayout
from arl_tangram.managers.cpu.sandbox_start import spawn_init


class SandboxState(enum.StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    HELD = "held"
    ACTIVE = "active"
    DEAD = "dead"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"


S = SandboxState
_TRANSITIONS: dict[tuple[SandboxState, SandboxState], str] = {
    (S.STARTING, S.IDLE): "init is up; frozen at zero CPU until the first grant",
    (S.STARTING, S.DEAD): "init failed to start",
    (S.STARTING, S.DESTROYING): "start aborted (failed, or the manager closed meanwhile)",
    (S.IDLE, S.ACTIVE): "first grant: slot quota and cpuset set, sandbox thawed",
    (S.IDLE, S.IDLE): "a parked slot changed (a session opened or closed); still frozen",
    (S.IDLE, S.HELD): "a standing holding: thawed, limited to the holding",
    (S.HELD, S.HELD): "the holding changed",
    (S.HELD, S.IDLE): "holding released with nothing running: frozen at zero CPU",
    (S.HELD, S.ACTIVE): "an action starts within (or on top of) the holding",
    (S.ACTIVE, S.ACTIVE): "a grant added or released while others still run",
    (S.ACTIVE, S.IDLE): "last grant released, no holding: frozen at zero CPU",
    (S.ACTIVE, S.HELD): "last grant released; the holding stays",
    (S.IDLE, S.DEAD): "init found gone, or an action's tasks could not be killed",
    (S.HELD, S.DEAD): "init found gone while held",
    (S.ACTIVE, S.DEAD): "init found gone while actions ran",
    (S.IDLE, S.DESTROYING): "destroyed by the caller",
    (S.HELD, S.DESTROYING): "destroyed by the caller",
    (S.ACTIVE, S.DESTROYING): "destroyed by the caller; running actions end cancelled",
    (S.DEAD, S.DESTROYING): "a dead sandbox's leftovers are removed",
    (S.DESTROYING, S.DESTROYED): "every task killed and every cgroup removed (or reported)",
}
_LIVE = (S.IDLE, S.HELD, S.ACTIVE)
DEMOTED_SHARES = 2  # v1's floor cpu.shares (v2 weight 1): runs only on cycles others leave idle


class SandboxGoneError(SandboxDeadError):
    """The sandbox is being destroyed (or was): a call racing the destroy ends cancelled."""


@dataclass(frozen=True)
class Holding:
    """A standing grant for the sandbox's life. ``limit``: Guaranteed (quota = request, on
    ``cpus``); else Burstable (weight by request, no quota, on every cpu)."""

    millicores: int
    cpus: tuple[int, ...]
    limit: bool


@dataclass
class _Slot:
    kind: str = "free"  # free | action | session | kept (background jobs an action kept)
    running: bool = False  # a grant is applied to it now
    cpus: tuple[int, ...] = ()
    millicores: int = 0
    stale_quota_us: int | None = None  # empty and free: the quota its last run left (``end``)


class Sandbox:
    """A stateful sandbox. ``group`` is its cgroup name; ``init_pid`` the host pid of the
    bubblewrap pid-1 whose namespaces every action enters."""

    def __init__(self, sandbox_id: str, driver: CgroupDriver, layout: SandboxLayout, all_cpus: tuple[int, ...]) -> None:
        self.sandbox_id = sandbox_id  # the public id; a pooled sandbox is renamed when handed out
        self.group = f"sb-{secrets.token_hex(6)}"
        self.layout = layout
        self.lock = threading.RLock()
        self.state = SandboxState.STARTING
        self.init_pid = -1
        self.dead_reason: str | None = None
        self.holding: Holding | None = None
        self._driver = driver
        self._all_cpus = all_cpus
        self._demoted = False  # a slot of it was demoted (``demote``): its CPU weight is the floor
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._slots: dict[str, _Slot] = {INIT_SLOT: _Slot(kind="init")}
        self._grants: dict[int, int] = {}  # manual grants (CpuManager.grant): token -> millicores
        self._next = 0
        self._applied_quota: int | None = None
        self._applied_slots: dict[str, tuple[tuple[int, ...], int | None]] = {}
        self._frozen = False
        self._armed_pids: dict[str, int] = {}  # slot -> its armed launcher (``armed``), not a run's task
        self.before_destroy: Callable[[Sandbox], None] | None = None  # drops its armed launchers

    # -- state machine --------------------------------------------------------------------
    def _move(self, to: SandboxState) -> None:
        if (self.state, to) not in _TRANSITIONS:
            raise InvalidTransitionError(f"sandbox {self.sandbox_id}: {self.state} -> {to} is not a valid transition")
        self.state = to

    @property
    def is_destroying(self) -> bool:
        return self.state in (S.DESTROYING, S.DESTROYED)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, mem_bytes: int, pids_max: int) -> None:
        """Create the cgroups, start the init in them (unlimited meanwhile), then freeze."""
        self._driver.create_sandbox(self.group, mem_bytes, pids_max, self._all_cpus)
        self._driver.set_grant(self.group, None, -1)
        try:
            self._proc, self.init_pid = spawn_init(self.sandbox_id, self.layout, self._driver.join_files(self.group, INIT_SLOT))
            self._pidfd = os.pidfd_open(self.init_pid)
        except BaseException:
            with self.lock:
                self._move(S.DEAD)
            raise
        with self.lock:
            if self.state is S.STARTING:
                self._apply()
                self._move(S.IDLE)

    def alive(self) -> bool:
        """Whether the init still runs; marks the sandbox DEAD (once) when it does not."""
        with self.lock:
            if self.state not in (*_LIVE, S.STARTING):
                return False
            proc = self._proc
            gone = proc is None or proc.poll() is not None or not self._pidfd_alive()
            if gone and self.state in _LIVE:
                self._mark_dead(f"init (pid {self.init_pid}) exited with status {proc.returncode if proc else None}")
            return not gone

    def _pidfd_alive(self) -> bool:
        try:
            signal.pidfd_send_signal(self._pidfd, 0)
        except (ProcessLookupError, OSError):
            return False
        return True

    def _mark_dead(self, reason: str) -> None:
        self.dead_reason = reason
        self._move(S.DEAD)

    def mark_dead(self, reason: str) -> None:
        """Report a sandbox that cannot be trusted any more (e.g. unkillable leftovers)."""
        with self.lock:
            if self.state in _LIVE:
                self._mark_dead(reason)

    def ensure_usable(self) -> None:
        """Raise ``SandboxGoneError`` (destroying) or ``SandboxDeadError`` (dead) unless live."""
        with self.lock:
            if self.is_destroying:
                raise SandboxGoneError(f"sandbox {self.sandbox_id} is being destroyed")
            if not self.alive():
                raise SandboxDeadError(f"sandbox {self.sandbox_id} is {self.state}: {self.dead_reason or 'gone'}")

    def open_root(self) -> int:
        """An O_PATH fd of the sandbox's root, checked against a recycled pid: the pidfd taken
        at start must still name a live process after the open. The caller closes it."""
        with self.lock:
            self.ensure_usable()
            fd = os.open(f"/proc/{self.init_pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            if not self._pidfd_alive():
                os.close(fd)
                raise SandboxDeadError(f"sandbox {self.sandbox_id}: init is gone")
            return fd

    def open_stage(self, stage_dir: str) -> int:
        """An O_PATH fd of an image root's stage (the tmpfs holding its writable upper), as
        the bubblewrap monitor sees it: the monitor stays in the mount namespace the helper
        made, where the stage is mounted. Checked against a recycled pid (the monitor is our
        child, so its pid is not reused before we reap it). The caller closes it."""
        with self.lock:
            self.ensure_usable()
            proc = self._proc
            if proc is None or self.layout.root is None:
                raise SandboxDeadError(f"sandbox {self.sandbox_id} has no image root")
            fd = os.open(f"/proc/{proc.pid}/root{stage_dir}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            if proc.poll() is not None:
                os.close(fd)
                raise SandboxDeadError(f"sandbox {self.sandbox_id}: its monitor is gone")
            return fd

    def destroy(self) -> list[str]:
        """Kill every process, wait for the init, remove the cgroups. Idempotent; never
        raises for cleanup trouble: returns what could not be cleaned (empty = all gone)."""
        with self.lock:
            if self.state is S.DESTROYED:
                return []
            if self.state is not S.DESTROYING:
                self._move(S.DESTROYING)
        if self.before_destroy is not None:
            self.before_destroy(self)  # armed launchers: their sockets closed, reaped by their owner
        problems: list[str] = []
        left = self._driver.kill_sandbox(self.group)
        if self._driver.version == 0 and self.init_pid > 0:
            kill_tree(self.init_pid)  # no cgroup to kill through (unisolated mode)
        proc = self._proc
        if proc is not None:
            try:
                proc.wait(timeout=5.0)  # the monitor exits once the namespace's pid 1 died
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2.0)
                problems.append(f"bubblewrap monitor {proc.pid} did not exit by itself")
        # Launchers stuck (tasks left): last resort, kill everything including them.
        problems += self._kill_and_remove(kill=bool(left))
        with self.lock:
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
            self._move(S.DESTROYED)
        return problems

    def retry_cleanup(self) -> list[str]:
        """Second try for a destroy that left something (called by ``close``)."""
        return self._kill_and_remove(kill=True)

    def _kill_and_remove(self, *, kill: bool) -> list[str]:
        """Kill every task of the sandbox's cgroups (host-level ones too) if ``kill``, then
        remove the cgroups; returns what could not be done."""
        problems = []
        if kill:
            left = self._driver.kill_sandbox(self.group, spare_host=False)
            if left:
                problems.append(f"{left} tasks survived the kill")
        try:
            self._driver.remove_sandbox(self.group)
        except OSError as exc:
            problems.append(f"cgroups not removed: {exc}")
        return problems

    # -- holding and grants ---------------------------------------------------------------
    def set_holding(self, holding: Holding | None) -> Holding | None:
        """Set (or with None release) the standing holding; returns the previous one."""
        with self.lock:
            self.ensure_usable()
            old, self.holding = self.holding, holding
            self._apply()
            self._settle()
            return old

    def begin(self, cpus: tuple[int, ...], millicores: int, slot: str | None = None, kind: str = "action") -> str:
        """Apply one run's grant to ``slot`` (a fresh or reused one when None) and thaw."""
        with self.lock:
            self.ensure_usable()
            if millicores == 0 and self.holding is None:
                raise InvalidRequestError("millicores", "0 is valid only for a sandbox with a holding (hold)", 0)
            name = slot if slot is not None else self._acquire_slot(armed_first=kind == "action")
            s = self._slots[name]
            s.kind, s.running, s.cpus, s.millicores = kind, True, cpus, millicores
            self._apply()
            self._move(S.ACTIVE)
            return name

    def end(self, slot: str, keep: str = "free") -> None:
        """Take a run's grant back; ``keep`` says what the slot is now (free, session, kept)."""
        with self.lock:
            s = self._slots.get(slot)
            if s is None or self.state not in _LIVE:
                return
            s.kind, s.running, s.cpus, s.millicores = keep, False, (), 0
            applied = self._applied_slots.pop(slot, None)
            if keep == "free" and applied is not None:
                # Empty now (the run's leftovers were killed): its settings matter again only
                # at its next begin, so they stay as they are (two cgroup writes saved per
                # run, a cpuset write among them). Its cpuset is known; its quota is not (a
                # kill lifts it), so the next begin writes the quota whatever it is.
                self._applied_slots[slot] = (applied[0], None)
                s.stale_quota_us = applied[1]
            if self._demoted and not any(x.running for x in self._slots.values()):
                h = self.holding  # back to the weight it had: a Burstable holding's, else the default
                self._driver.set_shares(self.group, h.millicores * 1024 // 1000 if h is not None and not h.limit else 1024)
                self._demoted = False
            self._apply()
            self._settle()

    def slot_cpu_s(self, slot: str) -> float:
        """CPU seconds the slot's current run has used (its counters reset at its start)."""
        with self.lock:
            return self._driver.slot_cpu_ns(self.group, slot) / 1e9 if slot in self._slots else 0.0

    def demote(self, slot: str) -> bool:
        """Preemption (``core.preemption``): the running action in ``slot`` keeps running,
        unchanged, on all of the sandbox's cpus at the floor CPU weight, so it gets only
        what granted actions leave idle (its cores were re-granted). Undone when the slot
        ends. False when the slot no longer runs (the action ended first)."""
        with self.lock:
            s = self._slots.get(slot)
            if s is None or not s.running or self.state not in _LIVE:
                return False
            s.cpus, s.millicores = self._all_cpus, len(self._all_cpus) * 1000
            self._driver.set_shares(self.group, DEMOTED_SHARES)
            self._demoted = True
            self._apply()
            return True

    def promote(self, shares: int | None = None) -> None:
        """Raise a demoted run's weight while it still runs: to ``shares`` (aging; capped at
        its normal weight), or back to its normal weight (None)."""
        with self.lock:
            if self._demoted and self.state in _LIVE:
                h = self.holding
                normal = h.millicores * 1024 // 1000 if h is not None and not h.limit else 1024
                self._driver.set_shares(self.group, normal if shares is None else max(DEMOTED_SHARES, min(shares, normal)))

    def add_grant(self, millicores: int) -> int:
        """A sandbox-wide grant with no slot (``CpuManager.grant``); returns its token."""
        with self.lock:
            self.ensure_usable()
            self._next += 1
            self._grants[self._next] = millicores
            self._apply()
            self._move(S.ACTIVE)
            return self._next

    def remove_grant(self, token: int) -> None:
        with self.lock:
            if self._grants.pop(token, None) is None or self.state not in _LIVE:
                return
            self._apply()
            self._settle()

    def _running(self) -> bool:
        return bool(self._grants) or any(s.running for s in self._slots.values())

    def _settle(self) -> None:
        if self._running():
            self._move(S.ACTIVE)
        else:
            self._move(S.HELD if self.holding is not None else S.IDLE)

    @property
    def granted_millicores(self) -> int:
        with self.lock:
            return sum(self._grants.values()) + sum(s.millicores for s in self._slots.values() if s.running)

    # -- cgroup settings (lock held) ---------------------------------------------------------
    def _apply(self) -> None:
        """Write only what changed: each cgroup write costs tens of microseconds."""
        h = self.holding
        running_mc = sum(self._grants.values()) + sum(s.millicores for s in self._slots.values() if s.running)
        if h is not None and not h.limit:
            quota = -1
        elif h is not None:
            quota = quota_us(h.millicores + running_mc)
        else:
            quota = quota_us(running_mc) if self._running() else CPU_QUOTA_MIN_US
        freeze = not self._running() and h is None
        if freeze and self._applied_quota is not None:
            quota = self._applied_quota  # frozen, it gets no CPU at any quota: the next begin writes what it needs
        if freeze and not self._frozen:
            self._driver.freeze(self.group)
        # v1 refuses a child quota above its parent's: raise the sandbox's first, lower it last
        raising = self._applied_quota is not None and (quota < 0 or (0 <= self._applied_quota < quota))
        if raising or self._applied_quota is None:
            self._write_quota(quota)
        for name, s in self._slots.items():
            old = self._applied_slots.get(name)
            if old is not None and s.kind == "free" and not s.running and h is None:
                self._lift_stale_quota(name, s, quota)
                continue  # an empty free slot (see ``end``) of a sandbox frozen or running others
            want = self._slot_setting(s)
            if want != old:
                s.stale_quota_us = None
                self._driver.set_slot_grant(self.group, name, want[0] if old is None or old[0] != want[0] else None,
                                            want[1] if old is None or old[1] != want[1] else None)  # fmt: skip
                self._applied_slots[name] = want
        self._write_quota(quota)
        if not freeze and self._frozen:
            self._driver.thaw(self.group)
        self._frozen = freeze

    def _lift_stale_quota(self, name: str, s: _Slot, quota: int) -> None:
        """v1 refuses a sandbox quota below any child's (EINVAL): an empty slot that kept a
        larger quota from its last run (``end``) is lifted to unlimited first. Missed, a
        2-core run's ended slot failed the next lowering while a 1-core run went on, and
        the exception left ``exec`` (CI, ``test_grants``)."""
        if s.stale_quota_us is not None and 0 <= quota < s.stale_quota_us:
            self._driver.set_slot_grant(self.group, name, None, -1)
            s.stale_quota_us = None

    def _write_quota(self, quota: int) -> None:
        if quota != self._applied_quota:
            self._driver.set_grant(self.group, None, quota)
            self._applied_quota = quota

    def _slot_setting(self, s: _Slot) -> tuple[tuple[int, ...], int]:
        """(cpuset, quota) of one slot: a running slot gets exactly its grant (plus the
        holding's cpus and millicores); a parked one lives within the holding, or gets the
        minimum quota so background jobs cannot eat other actions' grants."""
        h = self.holding
        if s.running:
            if h is not None and h.limit:
                return tuple(sorted(set(s.cpus) | set(h.cpus))), quota_us(s.millicores + h.millicores)
            if h is not None and s.millicores == 0:
                return self._all_cpus, -1
            return s.cpus, quota_us(s.millicores)
        if h is not None:
            return (h.cpus, quota_us(h.millicores)) if h.limit else (self._all_cpus, -1)
        return self._all_cpus, CPU_QUOTA_MIN_US

    def _acquire_slot(self, armed_first: bool = True) -> str:
        """A free slot with no task in it (reused), else a new one; kept slots free up once
        their background jobs are gone."""
        # an action takes an armed slot first; anything else (a session) one without, last
        names = sorted(self._slots, key=lambda n: ((n in self._armed_pids) != armed_first, n))
        for name in names:
            s = self._slots[name]
            if s.kind == "kept" and not self._tasks(name):
                s.kind = "free"
            if s.kind == "free" and not self._tasks(name):
                return name
        name = f"a{len(self._slots)}"
        while name in self._slots:
            name += "x"
        self._driver.create_slot(self.group, name)
        self._slots[name] = _Slot()
        return name

    def _tasks(self, slot: str) -> list[int]:
        """The slot's tasks, its armed launcher left out."""
        armed = self._armed_pids.get(slot)
        return [p for p in self._driver.slot_pids(self.group, slot) if p != armed]

    def slot_is_free(self, slot: str) -> bool:
        """Whether ``slot`` exists, runs nothing and holds no task (the sandbox is live)."""
        with self.lock:
            s = self._slots.get(slot)
            return self.state in _LIVE and s is not None and s.kind == "free" and not s.running and not self._tasks(slot)

    def armed_pids(self) -> set[int]:
        """The pids of the armed launchers waiting in its slots (not tasks of a run)."""
        with self.lock:
            return set(self._armed_pids.values())

    def set_armed_pid(self, slot: str, pid: int | None) -> None:
        """Record (or forget, None) the armed launcher waiting in ``slot`` (``armed``)."""
        with self.lock:
            if pid is None:
                self._armed_pids.pop(slot, None)
            else:
                self._armed_pids[slot] = pid

    def remove_slot(self, slot: str) -> None:
        """Forget a slot whose tasks are gone (a closed session's)."""
        with self.lock:
            if self._slots.pop(slot, None) is not None and self.state in _LIVE:
                self._applied_slots.pop(slot, None)
                with contextlib.suppress(OSError):
                    self._driver.remove_slot(self.group, slot)

    def slot_join_files(self, slot: str) -> tuple[str, ...]:
        return self._driver.join_files(self.group, slot)

    def slot_cpus(self, slot: str) -> tuple[int, ...]:
        with self.lock:
            return self._slot_setting(self._slots[slot])[0]


__all__ = ["Holding", "Sandbox", "SandboxGoneError", "SandboxState"]
