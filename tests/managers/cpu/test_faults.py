"""Faults: timeouts, OOM, fork bomb, odd outputs, a sandbox killed from outside, cancel; on
the host root and on an image root."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from arl_tangram.managers.cpu.errors import SandboxDeadError
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.results import Outcome
from tests.managers.cpu.conftest import SpecMaker


def test_timeout_kills_the_tree_and_sandbox_survives(manager: CpuManager, any_sandbox: str, spec: SpecMaker) -> None:
    t0 = time.monotonic()
    r = manager.exec(any_sandbox, "(sleep 100 &) ; setsid sleep 100 & sleep 100", timeout_s=0.5)
    assert r.outcome is Outcome.TIMED_OUT and time.monotonic() - t0 < 5
    r = manager.exec(any_sandbox, "ps -eo comm | grep -c sleep || true")
    # only the init's own sleep remains (an image sandbox's init is not sleep)
    assert r.stdout == (b"0\n" if spec.image is not None else b"1\n")
    assert manager.exec(any_sandbox, "echo alive").stdout == b"alive\n"


def test_oom_is_reported_distinctly(manager: CpuManager, spec: SpecMaker) -> None:
    sid = manager.create_sandbox(spec(mem_bytes=64 << 20, pids_max=64, workspace_bytes=8 << 20, tmp_bytes=8 << 20))
    try:
        r = manager.exec(sid, ["python3", "-c", "x = bytearray(512 << 20); print('survived')"])
        assert r.outcome is Outcome.OOM_KILLED and r.exit_code == -9, r
        crash = manager.exec(sid, ["python3", "-c", "import os; os.kill(os.getpid(), 9)"])
        assert crash.outcome is Outcome.FAILED and crash.exit_code == -9
        assert manager.exec(sid, "echo fine").ok
    finally:
        manager.destroy_sandbox(sid)


def test_fork_bomb_is_contained(manager: CpuManager, spec: SpecMaker) -> None:
    sid = manager.create_sandbox(spec(mem_bytes=128 << 20, pids_max=48, workspace_bytes=8 << 20, tmp_bytes=8 << 20))
    try:
        box: dict[str, object] = {}
        worker = threading.Thread(target=lambda: box.update(r=manager.exec(sid, "bomb() { bomb | bomb; }; bomb", timeout_s=2)))
        t0 = time.monotonic()
        worker.start()
        time.sleep(0.5)
        sb = manager.get_sandbox(sid)
        assert 0 < len(manager.driver.sandbox_pids(sb.group)) <= 48  # held at pids_max
        t_host = time.monotonic()
        assert subprocess.run(["true"]).returncode == 0  # the host still spawns promptly
        assert time.monotonic() - t_host < 1.0
        worker.join(15)
        assert box["r"].outcome is Outcome.TIMED_OUT  # type: ignore[attr-defined]
        assert time.monotonic() - t0 < 10
        assert manager.exec(sid, "echo ok", timeout_s=10).stdout == b"ok\n"
    finally:
        manager.destroy_sandbox(sid)


def test_stdout_closed_early_huge_and_binary_output(manager: CpuManager, any_sandbox: str) -> None:
    r = manager.exec(any_sandbox, "echo first; exec 1>&-; sleep 0.2; echo late >&2")
    assert r.ok and r.stdout == b"first\n" and r.stderr == b"late\n"
    r = manager.exec(any_sandbox, "head -c 50000000 /dev/zero", max_output_bytes=1000)
    assert r.ok and len(r.stdout) == 1000 and r.stdout_truncated and r.stdout_bytes == 50_000_000
    r = manager.exec(any_sandbox, ["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 4)"])
    assert r.stdout == bytes(range(256)) * 4 and not r.stdout_truncated
    r = manager.exec(any_sandbox, "sleep 30 & echo detached")  # a child keeps stdout open
    assert r.ok and r.stdout == b"detached\n" and r.wall_s < 5


def test_cancel(manager: CpuManager, any_sandbox: str) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    r = manager.exec(any_sandbox, "sleep 30", cancel=cancel)
    assert r.outcome is Outcome.CANCELLED and r.wall_s < 5


def test_init_killed_from_outside_is_reported(manager: CpuManager, spec: SpecMaker) -> None:
    sid = manager.create_sandbox(spec())
    try:
        init_pid = manager.sandbox_info(sid).init_pid
        box: dict[str, object] = {}
        worker = threading.Thread(target=lambda: box.update(r=manager.exec(sid, "sleep 30", timeout_s=20)))
        worker.start()
        time.sleep(0.3)
        os.kill(init_pid, signal.SIGKILL)
        worker.join(10)
        assert not worker.is_alive()
        r = box["r"]
        assert r.outcome is Outcome.ERROR and "died" in (r.error or "")  # type: ignore[attr-defined]
        assert manager.sandbox_info(sid).state == "dead"
        with pytest.raises(SandboxDeadError):
            manager.exec(sid, "true")
    finally:
        manager.destroy_sandbox(sid)
