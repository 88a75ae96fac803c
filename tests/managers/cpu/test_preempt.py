"""Demotion of a running action (``Sandbox.demote`` through ``RunHandle``): the program runs
on, its output and exit code unchanged, on all of the sandbox's cpus at the floor CPU
weight, which is restored when it ends; a demotion before the slot exists waits for it,
one after the action ended does nothing."""

from __future__ import annotations

import threading
import time

import pytest

from arl_tangram.managers.cpu import preempt
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.preempt import RunHandle
from arl_tangram.managers.cpu.sandbox import DEMOTED_SHARES, Sandbox

# ~0.5 s of CPU, then a checksum that would differ if any step were lost or repeated
PROGRAM = "python3 -c 'import time\nt=time.time(); s=0\nwhile time.time()-t < 0.6: s+=1\nprint(sum(range(10**6))); raise SystemExit(7)'"


def _shares(manager: CpuManager, sandbox_id: str) -> int:
    group = manager.get_sandbox(sandbox_id).group
    return int(open(manager.driver._path("cpu", group, "cpu.shares")).read())  # type: ignore[attr-defined]


def test_a_demoted_action_runs_on_unchanged_and_its_weight_comes_back(manager: CpuManager, sandbox: str) -> None:
    if manager.driver.version != 1:
        pytest.skip("reads cgroup v1 cpu.shares")
    told: list[float] = []  # the handle's watcher (the dispatcher: the action's record)
    handle = RunHandle(on_demoted=told.append)
    out: dict[str, object] = {}
    runner = threading.Thread(target=lambda: out.update(r=manager.exec(sandbox, PROGRAM, timeout_s=20, handle=handle)))
    runner.start()
    deadline = time.monotonic() + 10
    while not handle.demote() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.demoted
    assert len(told) == 1 and told[0] <= time.monotonic()  # told once, when it happened
    assert _shares(manager, sandbox) == DEMOTED_SHARES  # the floor weight while it runs
    runner.join(30)
    r = out["r"]
    assert r.exit_code == 7 and r.stdout_text == f"{sum(range(10**6))}\n"  # type: ignore[attr-defined]
    assert _shares(manager, sandbox) == 1024  # restored when the slot ended
    handle.demote()  # detached: a late demotion changes nothing
    assert _shares(manager, sandbox) == 1024


def test_a_run_near_its_limit_is_never_demoted(manager: CpuManager, sandbox: str) -> None:
    handle = RunHandle()  # timeout 1 s: all of it is the final window, run at its normal weight
    runner = threading.Thread(target=lambda: manager.exec(sandbox, "sleep 0.5", timeout_s=1.0, handle=handle))
    runner.start()
    time.sleep(0.2)
    assert not handle.demote()
    runner.join(10)


def test_a_demoted_runs_weight_ages_back_up(manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if manager.driver.version != 1:
        pytest.skip("reads cgroup v1 cpu.shares")
    monkeypatch.setattr(preempt, "AGING_S", 0.2)  # doubles every 0.2 s instead of 2 s: a short test
    handle = RunHandle()
    spin = "python3 -c 'import time\nt=time.time()\nwhile time.time()-t < 1.5: pass'"  # outlives the checks
    runner = threading.Thread(target=lambda: manager.exec(sandbox, spin, timeout_s=20, handle=handle))
    runner.start()
    deadline = time.monotonic() + 10
    while not handle.demote() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    aged = _shares(manager, sandbox)
    runner.join(30)
    assert DEMOTED_SHARES < aged < 1024, aged  # risen with its wait, not yet back to its full weight


def test_a_demoted_run_that_times_out_is_killed_at_its_normal_weight(
    manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the floor weight a killed run's tasks (and the freezer stopping them) barely get
    CPU on a busy host: looping runs of a 3-s timeout ended 5-19 s after their start."""
    if manager.driver.version != 1:
        pytest.skip("reads cgroup v1 cpu.shares")
    seen: list[int] = []
    kill_slot = manager.driver.kill_slot

    def watched(group: str, slot: str) -> int:
        seen.append(_shares(manager, sandbox))  # the weight the kill runs under
        return kill_slot(group, slot)

    monkeypatch.setattr(manager.driver, "kill_slot", watched)
    handle = RunHandle()  # timeout 2 s: demotable during its first second
    out: dict[str, object] = {}
    spin = "python3 -c 'while True: pass'"
    runner = threading.Thread(target=lambda: out.update(r=manager.exec(sandbox, spin, timeout_s=2.0, handle=handle)))
    runner.start()
    deadline = time.monotonic() + 0.9
    while not handle.demote() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.demoted
    runner.join(30)
    assert out["r"].outcome.value == "timed_out"  # type: ignore[attr-defined]
    assert seen and seen[0] == 1024, seen


def test_a_demotion_wanted_before_the_run_counts_only_the_runs_own_cpu(manager: CpuManager, sandbox: str) -> None:
    """The slot's previous run computed for ~0.3 s; a short run whose demotion the core wanted
    before it started must not read that CPU as its own (it would be demoted at once)."""
    burn = "python3 -c 'import time\nt=time.process_time()\nwhile time.process_time()-t < 0.3: pass'"
    assert manager.exec(sandbox, burn, timeout_s=20).exit_code == 0
    handle = RunHandle()
    handle.demote()  # wanted before the run has a slot
    r = manager.exec(sandbox, "sleep 0.3", timeout_s=20, handle=handle)
    assert r.exit_code == 0
    assert not handle.demoted  # it used no CPU of its own


def test_a_run_known_long_is_demoted_at_once_without_computing_first(manager: CpuManager, sandbox: str) -> None:
    """``demote(at_once=True)`` (``PreemptAction.known_long``: a declared length already told
    that the run is long) does not wait for ``MIN_CPU_S`` of its own CPU; a plain demotion
    of the same sleeping run never lands (the test above and below)."""
    handle = RunHandle()
    runner = threading.Thread(target=lambda: manager.exec(sandbox, "sleep 0.6", timeout_s=20, handle=handle))
    runner.start()
    deadline = time.monotonic() + 5
    while not handle.demote(at_once=True) and time.monotonic() < deadline:
        time.sleep(0.02)  # until the run has its slot and counts its own CPU
    assert handle.demoted
    runner.join(10)


def test_a_demotion_wanted_before_the_fork_lands_once_the_program_runs(
    manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run demoted at once, asked before it has even started, is demoted only once its
    program is forked: its launcher joins the slot's cgroups at the normal weight (at the
    floor weight it held the kernel's cgroup lock for seconds, ``RunHandle.counting``)."""
    seen: list[int] = []
    real = Sandbox.demote

    def spying(self: Sandbox, slot: str) -> bool:
        seen.append(len(manager.driver.slot_pids(self.group, slot)))  # the launcher, the program
        return real(self, slot)

    monkeypatch.setattr(Sandbox, "demote", spying)
    handle = RunHandle()
    handle.demote(at_once=True)  # wanted before the exec: applied when it may be
    r = manager.exec(sandbox, "sleep 0.3", timeout_s=20, handle=handle)
    assert r.outcome == "succeeded" and handle.demoted
    assert seen and seen[0] >= 2, seen


def test_a_demotion_retried_until_the_run_computes_starts_no_thread_per_try(
    manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wanted demotion is tried every ``RETRY_S`` until the run has used ``MIN_CPU_S``; the
    tries run on the shared timer thread (``timer_queue.RUN_TIMERS``). A thread per try was
    43% of the server's interpreter-lock samples under verl's load (issue 26)."""
    started: list[str] = []
    real_start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    handle = RunHandle()
    runner = threading.Thread(target=lambda: manager.exec(sandbox, "sleep 0.6", timeout_s=20, handle=handle))
    runner.start()
    time.sleep(0.1)
    monkeypatch.setattr(threading.Thread, "start", counted)
    handle.demote()  # a sleeping run never reaches MIN_CPU_S: tried again every RETRY_S
    time.sleep(0.4)  # ~8 tries
    monkeypatch.undo()
    runner.join(10)
    assert not handle.demoted
    assert [n for n in started if n != "tangram-timers"] == [], started


def test_the_timer_queue_runs_due_calls_in_order_and_skips_cancelled_ones() -> None:
    from arl_tangram.managers.cpu.timer_queue import TimerQueue

    queue = TimerQueue(name="test-timers")
    ran: list[str] = []
    done = threading.Event()
    queue.call_later(0.15, lambda: ran.append("late"))
    queue.call_later(0.05, lambda: ran.append("early"))
    queue.call_later(0.10, lambda: ran.append("cancelled")).cancel()
    queue.call_later(0.0, lambda: 1 / 0)  # a failing callback does not stop the queue
    queue.call_later(0.2, done.set)
    assert done.wait(5)
    assert ran == ["early", "late"]
