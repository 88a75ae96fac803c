"""A run's timeout counts from its program's fork, not from its launcher's spawn: under load
the launcher's cgroup joins queue on the kernel's global cgroup lock (issue 26: hundreds of
launchers in ``cgroup_kn_lock_live``, short programs timed out having used no CPU). Here the
join is held up on purpose: one more file to join, a FIFO nobody reads for a while."""

from __future__ import annotations

import os
import threading
import time

import pytest

from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.native_launcher import launcher_path

HOLD_S = 1.5


def _slow_join(manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch, fifo: str) -> threading.Thread:
    """The next launch also opens ``fifo`` to write its pid, which blocks until ``HOLD_S``
    from now, when a reader opens it."""
    os.mkfifo(fifo)
    sb = manager.get_sandbox(sandbox)
    real = sb.slot_join_files
    monkeypatch.setattr(sb, "slot_join_files", lambda slot: (*real(slot), fifo))

    def read_later() -> None:
        time.sleep(HOLD_S)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never blocks, launcher or not
        time.sleep(0.5)  # the launcher's write lands meanwhile
        os.close(fd)

    reader = threading.Thread(target=read_later)
    reader.start()
    return reader


def test_a_slow_cgroup_join_is_not_counted_in_the_programs_timeout(
    manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    if launcher_path() is None:
        pytest.skip("the started notice comes from the native launcher")
    reader = _slow_join(manager, sandbox, monkeypatch, os.path.join(str(tmp_path), "join"))
    t0 = time.monotonic()
    r = manager.exec(sandbox, "sleep 0.4; echo done", timeout_s=1.0)
    reader.join()
    assert time.monotonic() - t0 >= HOLD_S  # it did wait for the join
    assert r.outcome.value == "succeeded" and r.stdout_text == "done\n", (r.outcome, r.stdout_text, r.stderr_text)


def test_a_program_that_outlives_its_timeout_after_a_slow_join_is_still_timed_out(
    manager: CpuManager, sandbox: str, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    reader = _slow_join(manager, sandbox, monkeypatch, os.path.join(str(tmp_path), "join"))
    t0 = time.monotonic()
    r = manager.exec(sandbox, "sleep 5; echo late", timeout_s=1.0)
    reader.join()
    assert r.outcome.value == "timed_out" and "late" not in r.stdout_text
    assert time.monotonic() - t0 < HOLD_S + 1.0 + 2.0  # its clock ran from the fork: ~1 s after the join
