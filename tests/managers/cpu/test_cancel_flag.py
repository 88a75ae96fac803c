"""A run's cancel flag wakes its pump (``cancel_flag.CancelFlag``) instead of being polled."""

from __future__ import annotations

import selectors
import subprocess
import threading
import time

import pytest

from arl_tangram.managers.cpu import proc_io
from arl_tangram.managers.cpu.cancel_flag import CancelFlag


def test_a_set_flag_is_readable_and_stays_set() -> None:
    flag = CancelFlag()
    with selectors.DefaultSelector() as sel:
        sel.register(flag.fileno(), selectors.EVENT_READ)
        assert sel.select(0) == []
        flag.set()
        flag.set()  # idempotent
        assert len(sel.select(0)) == 1 and flag.is_set()


def _pump(cancel: threading.Event, seconds: float, set_after_s: float | None, monkeypatch: pytest.MonkeyPatch) -> tuple[proc_io.PumpResult, int, float]:
    """Pump ``sleep seconds`` with ``cancel`` (set after ``set_after_s``); (result, selects, wall)."""
    waits = [0]
    real = selectors.DefaultSelector

    class Counting(real):  # type: ignore[misc, valid-type]
        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            waits[0] += 1
            return super().select(timeout)

    monkeypatch.setattr(proc_io.selectors, "DefaultSelector", Counting)
    proc = subprocess.Popen(["sleep", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if set_after_s is not None:
        threading.Timer(set_after_s, cancel.set).start()
    t0 = time.monotonic()
    res = proc_io.pump(proc, stdin=None, timeout_s=30.0, cap_bytes=1 << 16, cancel=cancel, on_stop=proc.kill)
    return res, waits[0], time.monotonic() - t0


def test_the_pump_sleeps_through_a_run_and_wakes_on_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    res, selects, _ = _pump(CancelFlag(), 1.0, None, monkeypatch)
    assert res.returncode == 0 and not res.cancelled
    # woken by the exit and the pipes' EOF, never by a timer: a polled flag wakes it ~20 times
    assert selects <= 6, selects
    res, _, wall = _pump(CancelFlag(), 30.0, 0.3, monkeypatch)
    assert res.cancelled and wall < 2.0


def test_a_plain_event_is_still_polled(monkeypatch: pytest.MonkeyPatch) -> None:
    res, selects, wall = _pump(threading.Event(), 30.0, 0.3, monkeypatch)
    assert res.cancelled and wall < 2.0 and selects >= 3
