"""Shell: persistent bash sessions inside a sandbox (cwd, env vars, functions and background
jobs survive between commands, as in SWE-ReX).

Protocol: each command is sent as one ``eval $'...'`` line (ANSI-C quoted, so any text,
heredocs and unbalanced quotes included, arrives intact and a syntax error cannot desync the
shell), with stdin from /dev/null, followed by two ``printf`` sentinels carrying a random
token and ``$?``. The output of a command is everything before its sentinel.

Who calls: ``SessionRegistry``, which applies the grant to the session's slot around every
``run`` (the slot is parked otherwise) and serialises runs of one session with
``ShellSession.lock``. ``kill`` may come from another thread during a run (close, destroy):
the run then sees its shell exit and returns.

A timeout or cancel kills the command's processes (all of the slot but the shell) on every
turn until the sentinel comes back, within the kill grace (else the shell is killed):
the shell may fork the command's next program after a kill. The output shown ends where the
command was stopped; what the shell itself does after (a builtin such as ``echo``) is not
the command's output. Its exit code is then ``None``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from arl_tangram.managers.cpu.actions import spawn_in_slot
from arl_tangram.managers.cpu.cgroup_driver import CgroupDriver
from arl_tangram.managers.cpu.cgroup_kill import KILL_GRACE_S
from arl_tangram.managers.cpu.sandbox import Sandbox

_SAFE = re.compile(rb"[A-Za-z0-9_./,:=+@%-]")
_TAIL_KEEP = 512


def ansi_c_quote(text: str) -> str:
    """``$'...'`` literal that bash decodes back to exactly ``text`` (no NUL allowed)."""
    out = []
    for b in text.encode():
        ch = bytes([b])
        out.append(ch.decode() if _SAFE.fullmatch(ch) else f"\\x{b:02x}")
    return "$'" + "".join(out) + "'"


class SentinelStream:
    """Collects one stream up to ``cap_bytes`` and spots the end-of-command sentinel."""

    def __init__(self, marker: bytes, cap_bytes: int) -> None:
        self.marker = marker
        self.cap_bytes = cap_bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.end: int | None = None  # stream offset where the sentinel starts
        self.cut_at: int | None = None  # stream offset of a stop: later output is dropped
        self.status: int | None = None

    def feed(self, chunk: bytes) -> None:
        if self.end is not None:
            return  # late output of background jobs after the sentinel: not this command's
        if len(self.head) < self.cap_bytes and self.cut_at is None:
            self.head += chunk[: self.cap_bytes - len(self.head)]
        self.tail += chunk
        self.total += len(chunk)
        idx = self.tail.find(self.marker)
        if idx >= 0:
            nl = self.tail.find(b"\n", idx + len(self.marker))
            if nl >= 0:
                self.end = self.total - len(self.tail) + idx
                word = bytes(self.tail[idx + len(self.marker) : nl]).strip()
                self.status = int(word) if word.lstrip(b"-").isdigit() else None
            return
        if len(self.tail) > _TAIL_KEEP:
            del self.tail[: len(self.tail) - _TAIL_KEEP]

    def cut(self) -> None:
        """The command was stopped here: what follows (up to the sentinel) is not shown."""
        self.cut_at = self.total

    def content(self) -> tuple[bytes, bool, int]:
        """(captured bytes, truncated, real length) of the command's output."""
        end = self.total if self.end is None else self.end
        if self.cut_at is not None:
            end = min(end, self.cut_at)
        return bytes(self.head[: min(len(self.head), end)]), end > self.cap_bytes, end


@dataclass
class SessionRun:
    exit_code: int | None
    stdout: SentinelStream
    stderr: SentinelStream
    timed_out: bool
    cancelled: bool
    session_died: bool


class ShellSession:
    """One bash process in its own slot of a sandbox."""

    def __init__(self, session_id: str, sandbox: Sandbox, driver: CgroupDriver, slot: str, *, kill_grace_s: float = KILL_GRACE_S) -> None:
        self.session_id = session_id
        self.kill_grace_s = kill_grace_s
        self.sandbox = sandbox
        self.slot = slot
        self.lock = threading.Lock()
        self.closed = False
        self.closing = False  # close or destroy began: a run in progress ends cancelled
        self._driver = driver
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, env: Mapping[str, str], cwd: str) -> None:
        """Spawn bash (the sandbox must be thawed) and wait until it answers."""
        self._proc = spawn_in_slot(self.sandbox, self.slot, ["/bin/bash", "--noprofile", "--norc"], env, cwd, True)
        for f in (self._proc.stdout, self._proc.stderr):
            assert f is not None
            os.set_blocking(f.fileno(), False)
        run = self.run("true", timeout_s=10.0, cap_bytes=4096, cancel=None)
        if run.exit_code != 0:
            self.kill()
            raise RuntimeError(f"session {self.session_id}: bash did not start: {run.stderr.content()[0]!r}")

    def run(self, command: str, *, timeout_s: float, cap_bytes: int, cancel: threading.Event | None) -> SessionRun:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        token = "__arl_" + secrets.token_hex(8)
        out = SentinelStream(f"\n{token} ".encode(), cap_bytes)
        err = SentinelStream(f"\n{token}".encode(), cap_bytes)
        self._discard_pending()
        line = (
            f"eval {ansi_c_quote(command)} </dev/null\n"
            f"printf '\\n%s %s\\n' {token} \"$?\"\nprintf '\\n%s\\n' {token} >&2\n"
        )
        try:
            proc.stdin.write(line.encode())
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            self.closed = True
            return SessionRun(None, out, err, False, False, True)
        return self._collect(proc, out, err, timeout_s, cancel)

    def _collect(self, proc: subprocess.Popen[bytes], out: SentinelStream, err: SentinelStream, timeout_s: float, cancel: threading.Event | None) -> SessionRun:
        assert proc.stdout is not None and proc.stderr is not None
        deadline = time.monotonic() + timeout_s
        stopped: str | None = None
        with selectors.DefaultSelector() as sel:
            pidfd = os.pidfd_open(proc.pid)
            try:
                sel.register(pidfd, selectors.EVENT_READ, None)
                sel.register(proc.stdout.fileno(), selectors.EVENT_READ, out)
                sel.register(proc.stderr.fileno(), selectors.EVENT_READ, err)
                while out.end is None or err.end is None:
                    now = time.monotonic()
                    if stopped is None and (now >= deadline or (cancel is not None and cancel.is_set())):
                        stopped = "cancelled" if cancel is not None and cancel.is_set() else "timed_out"
                        # what is in the pipes now was written before the stop; nothing
                        # later is the command's output (it must not show it ran on)
                        if self._pump(sel.select(0), sel):
                            break
                        out.cut()
                        err.cut()
                        deadline = now + self.kill_grace_s
                    elif stopped is not None and now >= deadline:
                        self.kill()  # the shell itself is stuck (e.g. a builtin loop)
                        break
                    if stopped is not None:
                        # again on every turn: the shell may fork the command's next
                        # program after a kill (or had not forked the first one yet)
                        self._kill_command()
                    wait = deadline - now
                    if cancel is not None or stopped is not None:
                        wait = min(wait, 0.05 if stopped is None else 0.005)
                    if self._pump(sel.select(max(0.0, wait)), sel):
                        break
            finally:
                os.close(pidfd)
        died = proc.poll() is not None
        if died:
            self.closed = True
            with contextlib.suppress(OSError):
                for fd, stream in ((proc.stdout.fileno(), out), (proc.stderr.fileno(), err)):
                    stream.feed(os.read(fd, 1 << 20))
        # a stopped command has no status of its own (what the shell ran after the kill is
        # not the command's result)
        status = None if stopped else out.status if out.end is not None else (proc.returncode if died else None)
        return SessionRun(status, out, err, stopped == "timed_out", stopped == "cancelled", died)

    @staticmethod
    def _pump(events: list[tuple[selectors.SelectorKey, int]], sel: selectors.BaseSelector) -> bool:
        """Read ready streams; True when the shell exited (its pidfd fired)."""
        exited = False
        for key, _ in events:
            if key.data is None:
                exited = True
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if chunk:
                key.data.feed(chunk)
            else:
                sel.unregister(key.fd)
        return exited

    def _discard_pending(self) -> None:
        """Drop what background jobs wrote since the last command ended."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        for f in (proc.stdout, proc.stderr):
            with contextlib.suppress(BlockingIOError, OSError):
                while os.read(f.fileno(), 65536):
                    pass

    def _shell_pids(self) -> set[int]:
        """Host pids of the launcher (nsenter) and of bash, which a timeout must spare."""
        proc = self._proc
        if proc is None:
            return set()
        pids = {proc.pid}
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/task/{proc.pid}/children", encoding="ascii") as f:
            pids.update(int(p) for p in f.read().split())
        return pids

    def _kill_command(self) -> int:
        """SIGKILL the running command's processes (everything in the slot but the shell and
        its launcher); returns how many were signalled."""
        spare = self._shell_pids()
        victims = [p for p in self._driver.slot_pids(self.sandbox.group, self.slot) if p not in spare]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(victims)

    def kill(self) -> None:
        """Kill the shell and everything it started; idempotent. The launcher is spared by
        the kill and exits once the shell is gone; it is killed only if it lingers."""
        self.closed = True
        self._driver.kill_slot(self.sandbox.group, self.slot)
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)

    def close_pipes(self) -> None:
        """Close our ends of the shell's pipes (after the run using them returned)."""
        proc = self._proc
        if proc is not None:
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()
