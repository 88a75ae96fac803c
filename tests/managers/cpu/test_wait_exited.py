"""``actions._wait_exited``: how the end of a stopped run waits for its launcher to exit."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from arl_tangram.managers.cpu import actions


def test_it_sleeps_on_the_pidfd_without_polling_and_leaves_the_child_unreaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """When 30 looping runs hit their timeout together, a 0.5-10 ms ``waitid`` poll each
    was 3,000 interpreter-lock wake-ups a second (issue 26): the wait must be one sleep."""
    calls = []
    real_waitid = os.waitid
    monkeypatch.setattr(os, "waitid", lambda *a: calls.append(a) or real_waitid(*a))
    child = subprocess.Popen(["sleep", "0.3"])
    try:
        t0 = time.monotonic()
        assert actions._wait_exited(child.pid, 5.0) is True
        assert 0.2 < time.monotonic() - t0 < 3.0
        assert calls == [], "the wait polled waitid"
        monkeypatch.undo()
        still_there = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        assert still_there is not None and still_there.si_pid == child.pid, "left for the pump to reap"
    finally:
        child.wait()


def test_it_gives_up_at_its_timeout_and_counts_a_reaped_child_as_gone() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        t0 = time.monotonic()
        assert actions._wait_exited(child.pid, 0.2) is False
        assert 0.15 < time.monotonic() - t0 < 2.0
    finally:
        child.kill()
        child.wait()
    assert actions._wait_exited(child.pid, 1.0) is True  # reaped: nothing left to wait for
