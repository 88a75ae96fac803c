"""Armed launchers (``managers/cpu/armed.py``): a freed slot gets a launcher that has joined
its cgroups and entered the sandbox as its user, and the slot's next run uses it, with the
same output, exit code, stdin, environment and timeout as a launch that joins on its path."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from arl_tangram.managers.cpu.armed import QUIET_S
from arl_tangram.managers.cpu.config import CpuManagerConfig
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.results import Outcome
from tests.managers.cpu.conftest import IN_CI, SMALL, host_can_sandbox


@pytest.fixture
def armed_manager() -> Iterator[CpuManager]:
    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
    mgr = CpuManager(CpuManagerConfig(default_spec=SMALL, arm_launchers=True))
    yield mgr
    mgr.close()


def _armed_pid(manager: CpuManager, sid: str, wait_s: float = 5.0) -> int:
    """The pid of the launcher armed in the sandbox (waits for the quiet period)."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        pids = manager.get_sandbox(sid).armed_pids()
        if pids:
            return pids.pop()
        time.sleep(QUIET_S / 3)
    raise AssertionError("no launcher was armed")


def _host_ids(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def test_a_freed_slot_gets_an_armed_launcher_and_the_next_run_uses_it(armed_manager: CpuManager) -> None:
    """Switch arming off (``arm_launchers=False``) and no launcher is ever armed."""
    sid = armed_manager.create_sandbox()
    assert armed_manager.exec(sid, "true").ok
    pid = _armed_pid(armed_manager, sid)
    sb = armed_manager.get_sandbox(sid)
    end = time.monotonic() + 5  # it joins on its own, before any run needs it
    while pid not in armed_manager.driver.sandbox_pids(sb.group) and time.monotonic() < end:
        time.sleep(0.02)
    assert pid in armed_manager.driver.sandbox_pids(sb.group)
    # frozen with the idle sandbox (it joined its freezer group last), in none of its namespaces
    assert sb.init_pid > 0 and os.readlink(f"/proc/{pid}/ns/pid") != os.readlink(f"/proc/{sb.init_pid}/ns/pid")
    r = armed_manager.exec(sid, ["sh", "-c", 'read x; echo "$x $FOO $(pwd)"; echo err >&2; exit 3'], stdin="hi\n", env={"FOO": "bar"})
    assert (r.outcome, r.exit_code, r.stdout, r.stderr) == (Outcome.FAILED, 3, b"hi bar /workspace\n", b"err\n")
    assert pid not in sb.armed_pids() and not os.path.exists(f"/proc/{pid}")  # used, and gone with its run
    assert len(sb._slots) == 2  # init and the one action slot: the armed one counted as free


def test_a_run_through_an_armed_launcher_times_out_and_reads_eof_without_stdin(armed_manager: CpuManager) -> None:
    sid = armed_manager.create_sandbox()
    assert armed_manager.exec(sid, "true").ok
    _armed_pid(armed_manager, sid)
    r = armed_manager.exec(sid, ["sh", "-c", "cat; echo done"])
    assert (r.outcome, r.stdout) == (Outcome.SUCCEEDED, b"done\n")
    _armed_pid(armed_manager, sid)
    t0 = time.monotonic()
    r = armed_manager.exec(sid, "while :; do :; done", timeout_s=0.5)
    assert r.outcome == Outcome.TIMED_OUT and time.monotonic() - t0 < 5


def test_destroying_a_sandbox_ends_its_armed_launcher(armed_manager: CpuManager) -> None:
    sid = armed_manager.create_sandbox()
    assert armed_manager.exec(sid, "true").ok
    pid = _armed_pid(armed_manager, sid)
    armed_manager.destroy_sandbox(sid)
    end = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped (no zombie)


def test_a_run_whose_armed_launcher_died_launches_as_usual(armed_manager: CpuManager) -> None:
    sid = armed_manager.create_sandbox()
    assert armed_manager.exec(sid, "true").ok
    pid = _armed_pid(armed_manager, sid)
    os.kill(pid, 9)
    time.sleep(0.2)
    r = armed_manager.exec(sid, "echo ok")
    assert (r.outcome, r.stdout) == (Outcome.SUCCEEDED, b"ok\n")
