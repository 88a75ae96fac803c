"""Chaos suite (issue 9), run as a hostile user would, on the host root and on an image
root. Each test names the fix it checks; with that fix switched off it fails."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from arl_tangram.managers.cpu.errors import InvalidRequestError
from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.results import Outcome
from tests.managers.cpu.conftest import SpecMaker


def _count(manager: CpuManager, sid: str, pattern: str) -> int:
    # "[w]hile" matches "while" but not the pgrep command line itself
    return int(manager.exec(sid, f"pgrep -c -f '[{pattern[0]}]{pattern[1:]}' || true").stdout.strip() or 0)


def test_background_loop_dies_with_its_action(manager: CpuManager, any_sandbox: str) -> None:
    """Fix: the slot is killed when the program exits (not only on timeout)."""
    r = manager.exec(any_sandbox, "while true; do :; done & echo started")
    assert r.ok and r.leftovers_killed >= 1
    r = manager.exec(any_sandbox, "sleep 0.5", cores=1)
    assert r.cpu_s < 0.2, r  # no unbilled loop eats this action's grant
    assert _count(manager, any_sandbox, "while true") == 0


def test_daemonising_double_fork_dies_with_its_action(manager: CpuManager, any_sandbox: str) -> None:
    r = manager.exec(any_sandbox, "(setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 &) ; echo ok")
    assert r.ok
    assert _count(manager, any_sandbox, "sleep 300") == 0


def test_fork_bomb_with_silent_output_leaves_a_usable_sandbox(manager: CpuManager, spec: SpecMaker) -> None:
    """Fix: leftovers killed after a 'succeeded' bomb; the sandbox is not silently broken.
    Fix: the run ends once its killed tasks are reaped (``settle_reaped``; the launcher
    reaps its program on a stop): zombies left in the pids budget of a sandbox frozen
    after its run made the next run's launcher fail to fork (CI)."""
    sid = manager.create_sandbox(spec(mem_bytes=256 << 20, pids_max=64, workspace_bytes=8 << 20, tmp_bytes=8 << 20))
    try:
        r = manager.exec(sid, "bomb() { bomb | bomb & }; bomb >/dev/null 2>&1", timeout_s=3)
        assert r.outcome in (Outcome.SUCCEEDED, Outcome.TIMED_OUT)  # bash may retry a failed fork
        assert manager.driver.sandbox_unreaped(manager.get_sandbox(sid).group) == 0, r
        for _ in range(3):
            ok = manager.exec(sid, "echo ok", timeout_s=10)
            assert ok.stdout == b"ok\n", ok
        assert len(manager.driver.sandbox_pids(manager.get_sandbox(sid).group)) <= 4
        assert manager.sandbox_info(sid).state == "idle"
    finally:
        manager.destroy_sandbox(sid)


def test_destroy_of_a_busy_idle_sandbox_is_fast_and_complete(manager: CpuManager, spec: SpecMaker) -> None:
    """Fix: the kill lifts the quota (an idle sandbox had 1 ms per 100 ms) and retries are
    bounded and reported; the sandbox stays known until its cgroups are gone."""
    sid = manager.create_sandbox(spec(mem_bytes=512 << 20, pids_max=700, workspace_bytes=8 << 20, tmp_bytes=8 << 20))
    group = manager.get_sandbox(sid).group
    r = manager.exec(sid, "for i in $(seq 300); do (while :; do :; done) & done; echo up", background=True, timeout_s=30)
    assert r.ok, r
    assert len(manager.driver.sandbox_pids(group)) >= 300
    t0 = time.monotonic()
    manager.destroy_sandbox(sid)
    assert time.monotonic() - t0 < 3.0
    assert not glob.glob(f"/sys/fs/cgroup/*/{manager.root_name}/{group}")


def test_dev_is_bounded(manager: CpuManager, any_sandbox: str) -> None:
    r = manager.exec(any_sandbox, "echo x > /dev/junk; head -c 64M /dev/zero > /dev/shm/big; echo $?; df -k /dev/shm | tail -1")
    assert b"Read-only" in r.stderr and b"No space left" in r.stderr
    assert manager.exec(any_sandbox, "echo hi > /dev/null && echo fine").stdout == b"fine\n"


def test_fifo_at_the_target_never_blocks_a_host_call(manager: CpuManager, any_sandbox: str) -> None:
    """Fix: writes go to a temp file renamed over the target; reads open non-blocking."""
    assert manager.exec(any_sandbox, "mkfifo pipe && mkfifo /tmp/p2").ok
    box: dict[str, object] = {}

    def write() -> None:
        manager.write_file(any_sandbox, "pipe", b"data")
        box["done"] = True

    t = threading.Thread(target=write, daemon=True)
    t.start()
    t.join(5)
    assert box.get("done"), "write_file blocked on a FIFO"
    assert manager.read_file(any_sandbox, "pipe") == b"data"
    with pytest.raises(InvalidRequestError, match="regular file"):
        manager.read_file(any_sandbox, "/tmp/p2")


def test_sparse_file_is_refused_not_loaded(manager: CpuManager, any_sandbox: str, tmp_path: object) -> None:
    assert manager.exec(any_sandbox, "truncate -s 1536M big").ok
    with pytest.raises(InvalidRequestError, match="max_file_bytes"):
        manager.read_file(any_sandbox, "big")
    target = os.path.join(str(tmp_path), "big")
    with pytest.raises(InvalidRequestError, match="cap"):
        manager.download(any_sandbox, "big", target)
    assert not os.path.exists(target) or os.path.getsize(target) == 0
    assert manager.read_file(any_sandbox, "big", max_bytes=4) == b"\0" * 4


def test_writes_are_atomic_for_concurrent_readers(manager: CpuManager, any_sandbox: str) -> None:
    size = 1 << 20
    manager.write_file(any_sandbox, "f", b"a" * size)
    stop = threading.Event()
    torn: list[int] = []

    def read() -> None:
        while not stop.is_set():
            data = manager.read_file(any_sandbox, "f")
            if data not in (b"a" * size, b"b" * size):
                torn.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(40):
        manager.write_file(any_sandbox, "f", (b"b" if i % 2 == 0 else b"a") * size)
    stop.set()
    reader.join()
    assert not torn


def test_embedding_process_orphans_are_not_left_as_zombies(manager: CpuManager) -> None:
    """Fix: the manager is no child subreaper; an orphan of the host app goes to its init."""
    subprocess.run(["sh", "-c", "sleep 0.2 &"], check=True)
    time.sleep(0.8)
    zombies = [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert not zombies


_CRASHER = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from arl_tangram.managers.cpu import CpuManager, CpuManagerConfig, SandboxSpec
    from arl_tangram.managers.cpu.rootfs import ImageRoot
    root = ImageRoot(lower_dirs=(Path(sys.argv[1]),)) if len(sys.argv) > 1 else None
    mgr = CpuManager(CpuManagerConfig(default_spec=SandboxSpec(mem_bytes=128 << 20, pids_max=64, workspace_bytes=8 << 20, tmp_bytes=8 << 20)))
    pids = []
    for i in range(3):
        sid = mgr.create_sandbox(SandboxSpec(mem_bytes=128 << 20, pids_max=64, workspace_bytes=8 << 20, tmp_bytes=8 << 20, root=root))
        mgr.exec(sid, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &", background=True)
        threading.Thread(target=mgr.exec, args=(sid, "while :; do :; done"), kwargs={"timeout_s": 600}, daemon=True).start()
        pids.append(mgr.get_sandbox(sid).init_pid)
    time.sleep(0.5)
    print(mgr.root_name, *pids, flush=True)
    time.sleep(600)
    """
)


def test_kill_9_of_the_manager_leaves_nothing(manager: CpuManager, spec: SpecMaker) -> None:
    """Fix: the keeper sweeps when its manager dies; a new manager sweeps dead roots."""
    image = [str(spec.image)] if spec.image is not None else []
    child = subprocess.Popen([sys.executable, "-c", _CRASHER, *image], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    root, *pids = child.stdout.readline().split()
    assert glob.glob(f"/sys/fs/cgroup/*/{root}")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    CpuManager(manager.config).close()  # a new manager's start sweeps too
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (glob.glob(f"/sys/fs/cgroup/*/{root}") or any(psutil.pid_exists(int(p)) for p in pids)):
        time.sleep(0.05)
    assert not glob.glob(f"/sys/fs/cgroup/*/{root}")
    assert not [p for p in pids if psutil.pid_exists(int(p)) and psutil.Process(int(p)).status() != psutil.STATUS_ZOMBIE]
