"""Shell: launchers armed ahead of a slot's next run (their cgroup joins off the run's path).

Why: a launch joins the slot's cgroups (six on cgroup v1), and every join takes the kernel's
global cgroup lock and its thread-group semaphore for writing, which holds up every fork
and every exit on the host meanwhile. When hundreds of runs start at once (verl's reward
calls, issue 26) the joins queue for seconds: programs fork late, and finished ones cannot
even exit (their exit waits on that semaphore), so short runs ran into their timeouts.

An armed launcher is the native launcher started in a free slot with nothing to run yet: it
joins the slot's cgroups (the freezer last: an idle sandbox is frozen, and so is the
launcher, in none of the sandbox's namespaces yet), and once thawed enters the sandbox's
namespaces as its user and blocks reading the rest of its arguments from a socket
(``native_launcher``'s armed mode). A run in that slot sends them (``Armed.launch``) and
goes straight to the namespaces and the fork: no join on its path. The launcher is the
manager's child as any other, so a run waits for, times out and kills it the same way.

When: a slot is armed once its run has ended (``request``), by one worker thread, one
launcher at a time and only after ``QUIET_S`` without a launch on this manager: the joins
are done between bursts, never adding to a burst's queue on the lock. A run whose slot is
not armed yet launches as before (joins included), so nothing waits on arming.

Invariants: an armed launcher holds no CPU and only its own few pages; the sandbox knows
its pid (``Sandbox.armed_pids``), so the slot still counts as empty; a sandbox's armed
launchers are dropped (socket closed: the launcher exits 0; killed; reaped here) before it
is destroyed, and all of them when the manager stops.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu.launch import HOST_ENV, NOTICE_FD_ENV, native_head
from arl_tangram.managers.cpu.sandbox import Sandbox

ARMED_ENV = "ARL_TANGRAM_ARMED"
QUIET_S = 0.3  # assumption: a burst's launches come closer together than this
REAP_S = 0.5  # how often dropped launchers are looked at until reaped
#: how long ``Armed.launch`` looks for the launcher's answer (its fork's byte, or EOF when it
#: is gone) before leaving the wait to the run's pump
FORK_LOOK_S = 0.5
log = logging.getLogger(__name__)


@dataclass
class Armed:
    """One armed launcher: its process (stdin, stdout and stderr pipes) and our end of its
    socket (the arguments go out on it; the started notice comes back on it)."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket

    def launch(self, args: Sequence[str], stdin_pipe: bool) -> int:
        """Send the run's arguments (``launch.native_run``); the fd to wait on for the
        started notice (owned by the caller from now on). ``OSError`` when the launcher is
        gone, also when it was killed while its sandbox was frozen: it then lives on until
        the run's grant thaws the sandbox, takes the arguments and dies without forking,
        which the socket's EOF (looked for up to ``FORK_LOOK_S``, without reading the
        fork's byte) tells; the caller then launches as usual."""
        data = b"".join(a.encode() + b"\0" for a in args)
        self.sock.sendall(struct.pack("=I", len(data)) + data)
        ready, _, _ = select.select([self.sock], [], [], FORK_LOOK_S)
        if ready and self.sock.recv(1, socket.MSG_PEEK) == b"":
            raise OSError(errno.EPIPE, "the armed launcher is gone")
        if not stdin_pipe and self.proc.stdin is not None:
            self.proc.stdin.close()  # no stdin: the program reads EOF at once, as from /dev/null
            self.proc.stdin = None
        return self.sock.detach()


class Armory:
    """The armed launchers of one CPU manager; thread-safe."""

    def __init__(self, launcher: str | None, quiet_s: float = QUIET_S) -> None:
        self.launcher = launcher  # None: arming is off (the manager's default)
        self.quiet_s = quiet_s
        self._cond = threading.Condition()
        self._wanted: collections.OrderedDict[tuple[str, str], Sandbox] = collections.OrderedDict()
        self._armed: dict[tuple[str, str], Armed] = {}
        self._dropped: list[subprocess.Popen[bytes]] = []
        self._last_launch = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    def request(self, sandbox: Sandbox, slot: str) -> None:
        """Arm ``slot`` when the host is quiet (it must be free by then; else skipped)."""
        if self.launcher is None:
            return
        with self._cond:
            if self._closed or (sandbox.group, slot) in self._armed:
                return
            self._wanted[(sandbox.group, slot)] = sandbox
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="arl-tangram-armory", daemon=True)
                self._thread.start()
            self._cond.notify()

    def take(self, sandbox: Sandbox, slot: str) -> Armed | None:
        """The slot's armed launcher, now the caller's to launch (None: not armed); every
        launch asks, so it also marks the host busy (no arming for ``quiet_s``)."""
        with self._cond:
            self._last_launch = time.monotonic()
            self._wanted.pop((sandbox.group, slot), None)
            armed = self._armed.pop((sandbox.group, slot), None)
        if armed is not None:
            sandbox.set_armed_pid(slot, None)
        return armed

    def discard(self, armed: Armed) -> None:
        """An armed launcher taken but found gone: reaped here."""
        with self._cond:
            self._dropped.append(self._disarm(armed))
            self._cond.notify()

    def drop(self, sandbox: Sandbox) -> None:
        """Drop the sandbox's armed launchers and wanted arms (before it is destroyed)."""
        with self._cond:
            for key in [k for k in (*self._wanted, *self._armed) if k[0] == sandbox.group]:
                self._wanted.pop(key, None)
                if (armed := self._armed.pop(key, None)) is not None:
                    self._dropped.append(self._disarm(armed))
            self._cond.notify()

    def close(self) -> None:
        """Drop every armed launcher and stop the worker (it reaps what it can first)."""
        with self._cond:
            self._closed = True
            self._wanted.clear()
            self._dropped.extend(self._disarm(a) for a in self._armed.values())
            self._armed.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)
        self._reap(wait_s=2.0)

    @staticmethod
    def _disarm(armed: Armed) -> subprocess.Popen[bytes]:
        armed.sock.close()  # EOF: a launcher still blocked on its arguments exits 0
        with contextlib.suppress(ProcessLookupError):
            armed.proc.kill()  # one still joining (or frozen with its sandbox) ends anyway
        for pipe in (armed.proc.stdin, armed.proc.stdout, armed.proc.stderr):
            if pipe is not None:
                pipe.close()
        return armed.proc

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._wanted and not self._dropped:
                    self._cond.wait()
                if self._closed:
                    return
                quiet_in = self._last_launch + self.quiet_s - time.monotonic()
                item = self._wanted.popitem(last=False) if self._wanted and quiet_in <= 0 else None
                if item is None:
                    self._cond.wait(min(REAP_S, max(quiet_in, 0.01)))
            self._reap()
            if item is not None:
                try:
                    self._arm(*item)
                except Exception:  # noqa: BLE001 - arming is an optimisation; the run launches as before
                    log.debug("arming %s failed", item[0], exc_info=True)

    def _arm(self, key: tuple[str, str], sandbox: Sandbox) -> None:
        assert self.launcher is not None
        slot = key[1]
        # Under the sandbox's lock: a run cannot begin in the slot meanwhile, so the slot is
        # free (no task) when the launcher enters it, and registered before it is next used.
        with sandbox.lock:
            if not sandbox.slot_is_free(slot):
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                env = {**HOST_ENV, NOTICE_FD_ENV: str(theirs.fileno()), ARMED_ENV: "1"}
                head = native_head(self.launcher, sandbox.slot_join_files(slot), sandbox.init_pid, sandbox.layout)
                proc = subprocess.Popen(
                    head, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env=env, pass_fds=(theirs.fileno(),),
                )  # fmt: skip
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            sandbox.set_armed_pid(slot, proc.pid)
        with self._cond:
            if self._closed:
                self._dropped.append(self._disarm(Armed(proc, ours)))
                sandbox.set_armed_pid(slot, None)
            else:
                self._armed[key] = Armed(proc, ours)

    def _reap(self, wait_s: float = 0.0) -> None:
        with self._cond:
            dropped, self._dropped = self._dropped, []
        end = time.monotonic() + wait_s
        left = []
        for proc in dropped:
            try:
                proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                left.append(proc)
        with self._cond:
            self._dropped.extend(left)
