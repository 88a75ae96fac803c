"""Timeouts that always kill (issue 23, item 5), on real sandboxes.

Whatever the moment the timeout fires (before the launcher joined the slot's cgroups, between
the join and the fork, or while the program runs), the action's processes are gone within
the kill grace, and its output never shows it ran past the timeout: the program sleeps
longer than the timeout and then prints ``post-``, which must never appear. Each program's
sleep carries a unique length, so its processes are found on the host by their command line.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arl_tangram.managers.cpu.actions import end_of_action, spawn_in_slot
from arl_tangram.managers.cpu.cgroup_kill import KILL_GRACE_S
from arl_tangram.managers.cpu.config import CpuManagerConfig
from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.grants import grant_request
from arl_tangram.managers.cpu.launch import LAUNCH_TIMEOUT_MARK, LAUNCH_TIMEOUT_RC
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.native_launcher import launcher_path
from arl_tangram.managers.cpu.results import ExecResult, Outcome

TIMEOUTS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.2)
_token_seq = iter(range(1, 1 << 30))
_token_lock = threading.Lock()


def sleeper() -> tuple[str, str]:
    """(a unique sleep length that outlasts every timeout here, the program using it)."""
    with _token_lock:
        n = next(_token_seq)
    token = f"1.5{n:07d}"
    return token, f"sleep {token}; echo post-"


def alive_with(tokens: set[str]) -> set[str]:
    """Which of ``tokens`` a live process's command line on this host carries."""
    found: set[str] = set()
    wanted = {t.encode(): t for t in tokens}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        found.update(wanted[w] for w in words if w in wanted)
    return found


def gone_within(tokens: set[str], grace_s: float) -> set[str]:
    """Wait up to ``grace_s`` for every process carrying ``tokens`` to end; the survivors."""
    deadline = time.monotonic() + grace_s
    left = alive_with(tokens)
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = alive_with(left)
    return left


def check_timed_out(r: ExecResult, timeout_s: float) -> None:
    assert r.outcome is Outcome.TIMED_OUT, (timeout_s, r)
    assert b"post-" not in r.stdout, f"timeout_s={timeout_s}: the program ran past its timeout: {r.stdout!r} {r.stderr!r} {r.wall_s}"
    # the run's own clock starts before the spawn; the kill and its wait are inside the grace
    assert r.wall_s <= timeout_s + KILL_GRACE_S, (timeout_s, r.wall_s)


@pytest.mark.parametrize("timeout_s", TIMEOUTS_S)
def test_exec_timeout_kills_at_any_moment(manager: CpuManager, sandbox: str, timeout_s: float) -> None:
    for _ in range(3):
        token, program = sleeper()
        r = manager.exec(sandbox, program, timeout_s=timeout_s)
        check_timed_out(r, timeout_s)
        assert not gone_within({token}, KILL_GRACE_S), f"timeout_s={timeout_s}: the program outlived the kill grace"


@pytest.mark.parametrize("delay_s", (0.0, 0.001, 0.002, 0.005, 0.02))
def test_exec_cancel_kills_at_any_moment(manager: CpuManager, sandbox: str, delay_s: float) -> None:
    """A cancel has no launcher timer behind it: the manager's own stop must end the run
    whatever the launcher was doing (not yet joined, joined, running the program)."""
    for _ in range(3):
        token, program = sleeper()
        cancel = threading.Event()
        if delay_s == 0.0:
            cancel.set()  # before the spawn
        else:
            threading.Timer(delay_s, cancel.set).start()
        r = manager.exec(sandbox, program, cancel=cancel, timeout_s=30)
        assert r.outcome is Outcome.CANCELLED, r
        assert b"post-" not in r.stdout and r.wall_s <= delay_s + KILL_GRACE_S, r
        assert not gone_within({token}, KILL_GRACE_S)


@pytest.mark.parametrize("timeout_s", (0.001, 0.005, 0.05))
def test_session_timeout_kills_and_hides_what_ran_after(manager: CpuManager, sandbox: str, timeout_s: float) -> None:
    session = manager.open_session(sandbox)
    try:
        for _ in range(3):
            token, program = sleeper()
            r = manager.run_in_session(session, program, timeout_s=timeout_s)
            check_timed_out(r, timeout_s)
            assert r.exit_code is None  # what the shell ran after the kill is not the command's
            assert not gone_within({token}, KILL_GRACE_S)
        assert manager.run_in_session(session, "echo still-here").stdout == b"still-here\n"
    finally:
        manager.close_session(session)


def test_concurrent_timeouts_kill_every_action(manager: CpuManager) -> None:
    """150 actions at once over 10 sandboxes, timeouts from 1 ms to 0.2 s: every one times
    out, none prints ``post-``, none leaves a process past the grace."""
    sandboxes = [manager.create_sandbox() for _ in range(10)]
    jobs = [(sandboxes[i % 10], TIMEOUTS_S[i % len(TIMEOUTS_S)], *sleeper()) for i in range(150)]

    def one(job: tuple[str, float, str, str]) -> tuple[ExecResult, float]:
        sid, timeout_s, _, program = job
        return manager.exec(sid, program, timeout_s=timeout_s), timeout_s

    try:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(one, jobs))
        for r, timeout_s in results:
            check_timed_out(r, timeout_s)
        assert not gone_within({job[2] for job in jobs}, KILL_GRACE_S)
    finally:
        for sid in sandboxes:
            manager.destroy_sandbox(sid)


def test_the_launcher_keeps_the_deadline_when_the_manager_runs_late(manager: CpuManager, sandbox: str) -> None:
    """Nothing watches this run's deadline (as when the manager's threads are starved): the
    native launcher's own timer kills the program's process group and says so."""
    if launcher_path() is None:
        pytest.skip("no C compiler here: sandboxes are entered without the native launcher")
    sb = manager.get_sandbox(sandbox)
    cpus = manager.reserve(grant_request(manager.topology, cores=1))
    slot = sb.begin(cpus, 1000)
    try:
        for timeout_s in (0.001, 0.05):
            token, program = sleeper()
            proc = spawn_in_slot(sb, slot, ["/bin/sh", "-c", program], manager.base_env(sandbox, 1), "/workspace", False, timeout_s)
            out, err = proc.communicate(timeout=10)
            assert proc.returncode == LAUNCH_TIMEOUT_RC and err.endswith(LAUNCH_TIMEOUT_MARK), (proc.returncode, err)
            assert b"post-" not in out
            assert not alive_with({token}), "the launcher returned before the program's group was dead"
            end_of_action(manager.driver, sb, slot)
    finally:
        sb.end(slot, keep="free")
        manager.release(cpus)


def test_kill_grace_is_validated() -> None:
    with pytest.raises(InvalidRequestError, match="config.kill_grace_s"):
        CpuManagerConfig(kill_grace_s=0)
    assert CpuManagerConfig().kill_grace_s == KILL_GRACE_S <= 2.0
