"""A run whose program has ended by itself, its exit still held by the kernel, is waited
for at its deadline instead of timed out (``exit_held``, ``proc_io.pump(exit_held=...)``)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from arl_tangram.managers.cpu import exit_held, proc_io

needs_known_arch = pytest.mark.skipif(not exit_held._OURS, reason="exit syscall numbers unknown on this machine")


def _zombie() -> int:
    """A child that has exited and is not reaped yet (the caller reaps it)."""
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return pid
        time.sleep(0.01)
    raise AssertionError("the child did not become a zombie")


@needs_known_arch
def test_a_zombie_is_exiting_and_a_sleeping_or_gone_process_is_not() -> None:
    zombie = _zombie()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)  # in nanosleep by now
        assert exit_held.is_exiting(zombie)
        assert not exit_held.is_exiting(sleeper.pid)
        assert exit_held.program_exit_held([111, zombie], launcher_pid=111)
        assert not exit_held.program_exit_held([111, zombie, sleeper.pid], launcher_pid=111)
        assert exit_held.program_exit_held([zombie], launcher_pid=zombie)  # the launcher alone, exiting
        assert not exit_held.program_exit_held([], launcher_pid=zombie)
    finally:
        sleeper.kill()
        sleeper.wait()
        os.waitpid(zombie, 0)
    assert not exit_held.is_exiting(zombie)  # gone


def test_a_syscall_line_naming_exit_group_means_exiting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The /proc reading itself, on a copy of its two files: ``exit_group`` (x86_64's
    number) is exiting; another syscall, or ``running``, is not."""
    monkeypatch.setattr(exit_held, "_OURS", exit_held.EXIT_SYSCALLS["x86_64"])
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_bytes(b"4242 (a (b) c) S 1")  # a comm with parentheses
    for line, exiting in ((b"running", False), (b"231 0x0 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f00", True), (b"35 0x7ffd 0x0 0x0 0x0 0x0 0x0 0x7ffd 0x7f00", False)):
        (tmp_path / "4242" / "syscall").write_bytes(line)
        assert exit_held.is_exiting(4242, proc=str(tmp_path)) is exiting, line


def _pump(seconds: float, held: bool | None) -> tuple[proc_io.PumpResult, float]:
    proc = subprocess.Popen(["sleep", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    res = proc_io.pump(
        proc, stdin=None, timeout_s=0.2, cap_bytes=1 << 16, cancel=threading.Event(), on_stop=proc.kill,
        exit_held=None if held is None else (lambda: held),
    )  # fmt: skip
    return res, time.monotonic() - t0


def test_a_held_exit_at_the_deadline_is_waited_for_not_timed_out() -> None:
    res, wall = _pump(0.6, held=True)
    assert not res.timed_out and res.returncode == 0 and 0.5 < wall < 5.0
    assert res.held_at is not None and res.held_at - res.started_at >= 0.2  # first seen at the deadline
    for held in (False, None):  # the rule off, or a program still running: a timeout
        res, _ = _pump(0.6, held)
        assert res.timed_out and res.returncode != 0 and res.held_at is None  # killed, not its own end


def test_a_held_exit_is_waited_for_only_so_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc_io, "EXIT_HOLD_S", 0.3)
    res, wall = _pump(30.0, held=True)
    assert res.timed_out and 0.45 < wall < 10.0
