"""Shell: pump one started process's pipes until it exits, times out or is cancelled.

Output is capped per stream (the rest is drained and counted, so a chatty program never
blocks on a full pipe); binary output is kept as bytes. The wait ends when the *process*
exits, not when its pipes close: a background child that keeps stdout open cannot hang the
action (its remaining output is drained for ``drain_s`` only).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from arl_tangram.managers.cpu.fd_ready import readable
from arl_tangram.managers.cpu.run_watch import RunWatcher

_CHUNK = 65536
_STOP_GRACE_S = 10.0
_CANCEL_POLL_S = 0.05  # how often a cancel flag without a fileno is looked at
#: with a started notice, how long past its timeout a program may take to be forked before
#: its run is stopped (as timed out): a bound for a kernel stall, never reached in practice
START_WAIT_S = 30.0
#: how long past its deadline a run whose program has ended by itself (``exit_held``) is
#: waited for while the kernel finishes its exit; then it is stopped as timed out. The
#: stalls measured were 2.7-5 s (``exit_held``'s module doc); the bound only ends a wait
#: that something else keeps going
EXIT_HOLD_S = 5.0
EXIT_POLL_S = 0.02  # how often a held exit is looked at again (the exit itself wakes the wait)
_TAIL_BYTES = 64


#: ``on_output(stream, chunk)``: called on the pumping thread with each chunk read
#: ("stdout" or "stderr"), while the process runs; it must be quick and never raise.
OutputSink = Callable[[str, bytes], None]


@dataclass
class StreamBuffer:
    cap_bytes: int
    data: bytearray
    total_bytes: int = 0
    name: str = ""
    sink: OutputSink | None = None
    tail: bytes = b""  # the last bytes written, capped or not (a launcher's closing mark)

    def feed(self, chunk: bytes) -> None:
        room = self.cap_bytes - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total_bytes += len(chunk)
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]
        if self.sink is not None:
            self.sink(self.name, chunk)

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self.data)


@dataclass
class PumpResult:
    returncode: int | None
    stdout: StreamBuffer
    stderr: StreamBuffer
    timed_out: bool
    cancelled: bool
    stop_at: float | None = None  # monotonic: when the deadline (or cancel) was acted on
    killed_at: float | None = None  # monotonic: when ``on_stop`` returned (the kill done)
    started_at: float = 0.0  # monotonic: when the timeout began counting
    held_at: float | None = None  # monotonic: when its exit was first seen held at the deadline (``exit_held``)


def pump(
    proc: subprocess.Popen[bytes],
    *,
    stdin: bytes | None,
    timeout_s: float,
    cap_bytes: int,
    cancel: threading.Event | None,
    on_stop: Callable[[], None],
    drain_s: float = 0.05,
    on_output: OutputSink | None = None,
    started: float | None = None,
    stop_grace_s: float = _STOP_GRACE_S,
    paused_s: Callable[[], float] | None = None,
    watchers: Sequence[RunWatcher] = (),
    started_fd: int | None = None,
    exit_held: Callable[[], bool] | None = None,
    on_started: Callable[[], None] | None = None,
) -> PumpResult:
    """Feed ``stdin``, collect stdout/stderr (each chunk also to ``on_output`` as it is
    read, capped or not), and wait for ``proc``.

    The timeout counts from ``started`` (a ``time.monotonic()`` value; default: now), or,
    with ``started_fd`` (``actions.started_notice``'s read end, which the pump closes), from
    when that fd turns readable: the program's fork (until then, from ``started`` plus
    ``START_WAIT_S``). On
    timeout or cancel, ``on_stop`` is called once (it must kill the process tree); the wait
    then continues until the process is gone, at most ``stop_grace_s`` (then ``proc`` is
    killed). A process whose exit is already pending when the deadline is noticed has ended
    by itself and is not timed out; so has one for which ``exit_held()`` is true at the
    deadline (its program called ``exit`` and the kernel has not let it finish,
    ``exit_held``): it is waited for, up to ``EXIT_HOLD_S`` past the deadline.
    ``paused_s()`` (time it spent paused at its memory limit) pushes the deadline back
    (read whenever the thread wakes, so at the deadline at the latest). ``on_started()``
    is called once, on this thread, when the program is forked (``started_fd`` turned
    readable; at once without it). A ``cancel`` with ``fileno()``
    (``cancel_flag.CancelFlag``) wakes the wait when set; any other is polled every
    ``_CANCEL_POLL_S``. Called from one thread per process.
    """
    out = StreamBuffer(cap_bytes, bytearray(), name="stdout", sink=on_output)
    err = StreamBuffer(cap_bytes, bytearray(), name="stderr", sink=on_output)
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    for f, buf in ((proc.stdout, out), (proc.stderr, err)):
        if f is not None:
            os.set_blocking(f.fileno(), False)
            sel.register(f.fileno(), selectors.EVENT_READ, buf)
    cancel_fd = cancel.fileno() if cancel is not None and hasattr(cancel, "fileno") else None
    if cancel_fd is not None:
        sel.register(cancel_fd, selectors.EVENT_READ, "cancel")
    pending = memoryview(stdin or b"")
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        if pending:
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        else:
            proc.stdin.close()
    started_at = time.monotonic() if started is None else started
    base_deadline = deadline = started_at + timeout_s + (START_WAIT_S if started_fd is not None else 0.0)
    if started_fd is not None:
        sel.register(started_fd, selectors.EVENT_READ, "started")
    elif on_started is not None:
        on_started()
    stopped = timed_out = cancelled = exited = holding = False
    stop_at = killed_at = held_at = None
    watching = Watching(sel, watchers) if watchers else None
    try:
        while not exited:
            now = time.monotonic()
            if watching is not None and not stopped and watching.serve_due(now):
                now = time.monotonic()  # serving may take a while (a memory pause's freeze)
            if not stopped and paused_s is not None:
                deadline = base_deadline + paused_s()
            if not stopped:
                is_cancel = cancel is not None and cancel.is_set()
                holding = not is_cancel and now >= deadline and _exit_held(exit_held, now - deadline)
                if holding and held_at is None:
                    held_at = now
                if (now >= deadline or is_cancel) and not holding and not _exited(pidfd):
                    timed_out, cancelled, stopped = not is_cancel, is_cancel, True
                    stop_at = now
                    if watching is not None:
                        watching.stop()  # nothing is served while the run is stopped
                    on_stop()
                    killed_at = time.monotonic()
                    # the process tree is dead or dying; never wait on it for long
                    deadline = time.monotonic() + stop_grace_s
                    continue
            elif now >= deadline:
                proc.kill()
                break
            wait = EXIT_POLL_S if holding else deadline - now
            if cancel is not None and cancel_fd is None and not stopped:
                wait = min(wait, _CANCEL_POLL_S)
            if watching is not None and not stopped and (due := watching.next_due()) is not None:
                wait = min(wait, max(0.0, due - now))
            for key, _ in sel.select(wait):
                if isinstance(key.data, Watched):
                    watching.note_ready(key.data, key.fd)  # type: ignore[union-attr]
                elif key.data == "exit":
                    exited = True
                elif key.data == "cancel":
                    sel.unregister(key.fd)  # set for good: the loop's top acts on it
                elif key.data == "started":
                    sel.unregister(key.fd)  # one byte (forked) or EOF (the launcher is gone)
                    if not stopped:
                        started_at = time.monotonic()
                        base_deadline = deadline = started_at + timeout_s
                        if on_started is not None:
                            on_started()
                elif key.data == "stdin":
                    pending = _write_stdin(sel, proc, pending)
                else:
                    _read_into(sel, key.fd, key.data)
        proc.wait()
        _drain(sel, drain_s)
    finally:
        _close(sel, proc, pidfd)
        if started_fd is not None:
            os.close(started_fd)
    return PumpResult(proc.returncode, out, err, timed_out, cancelled, stop_at, killed_at, started_at, held_at)


@dataclass(frozen=True)
class Watched:
    """A watcher's fd's tag in the pump's selector."""

    index: int


class Watching:
    """The pump's side of its watchers: their fds in its selector, their due times."""

    def __init__(self, sel: selectors.BaseSelector, watchers: Sequence[RunWatcher]) -> None:
        self._sel, self._watchers = sel, tuple(watchers)
        now = time.monotonic()
        self._due: list[float | None] = [now] * len(self._watchers)  # each is served once at the start
        self._fds: list[tuple[int, ...]] = [()] * len(self._watchers)
        self._ready: list[set[int]] = [set() for _ in self._watchers]
        for i in range(len(self._watchers)):
            self._register(i)

    def _register(self, i: int) -> None:
        """Register watcher ``i``'s fds afresh (an fd another thread closed is forgotten: its
        number may be in use again)."""
        self._unregister(i)
        self._fds[i] = tuple(self._watchers[i].watched_fds())
        for fd in self._fds[i]:
            self._sel.register(fd, selectors.EVENT_READ, Watched(i))

    def _unregister(self, i: int) -> None:
        for fd in self._fds[i]:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(fd)
        self._fds[i] = ()

    def note_ready(self, tag: Watched, fd: int) -> None:
        self._ready[tag.index].add(fd)

    def next_due(self) -> float | None:
        return min((d for d in self._due if d is not None), default=None)

    def serve_due(self, now: float) -> bool:
        """Serve each watcher whose fds are ready or whose time is due; whether any was."""
        served = False
        for i, watcher in enumerate(self._watchers):
            due = self._due[i]
            if self._ready[i] or (due is not None and now >= due):
                ready = frozenset(self._ready[i])
                self._ready[i].clear()
                self._due[i] = watcher.serve(now, ready)
                self._register(i)
                served = True
        return served

    def stop(self) -> None:
        for i in range(len(self._watchers)):
            self._unregister(i)
            self._due[i] = None


def _exit_held(exit_held: Callable[[], bool] | None, past_s: float) -> bool:
    """Whether a run at (``past_s`` past) its deadline is still waited for: its program
    has ended by itself, within ``EXIT_HOLD_S``."""
    return exit_held is not None and past_s < EXIT_HOLD_S and exit_held()


def _exited(pidfd: int) -> bool:
    """True when the process behind ``pidfd`` has exited (its pidfd is readable)."""
    return readable(pidfd, 0)


def _write_stdin(sel: selectors.BaseSelector, proc: subprocess.Popen[bytes], pending: memoryview) -> memoryview:
    assert proc.stdin is not None
    try:
        n = os.write(proc.stdin.fileno(), pending[:_CHUNK])
        pending = pending[n:]
    except (BrokenPipeError, BlockingIOError) as exc:
        if isinstance(exc, BrokenPipeError):
            pending = pending[len(pending):]
    if not pending:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return pending


def _read_into(sel: selectors.BaseSelector, fd: int, buf: StreamBuffer) -> None:
    try:
        chunk = os.read(fd, _CHUNK)
    except BlockingIOError:
        return
    if chunk:
        buf.feed(chunk)
    else:
        sel.unregister(fd)


def _drain(sel: selectors.BaseSelector, drain_s: float) -> None:
    """Read what the exited process left in its pipes; stop early at EOF on all of them."""
    deadline = time.monotonic() + drain_s
    while time.monotonic() < deadline:
        readers = [k for k in sel.get_map().values() if isinstance(k.data, StreamBuffer)]
        if not readers:
            return
        for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
            if isinstance(key.data, StreamBuffer):
                _read_into(sel, key.fd, key.data)


def _close(sel: selectors.BaseSelector, proc: subprocess.Popen[bytes], pidfd: int) -> None:
    sel.close()
    os.close(pidfd)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
