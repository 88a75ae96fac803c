"""Memory per action on real cgroups (v1 here): an action over its grant pauses instead of
dying and resumes when memory is granted, whether it faults memory in or writes a tmpfs
(a charge a hard limit at the grant would fail with ENOMEM); past its env's limit it ends
``oom_killed`` and the env works again; paused time never counts against its timeout; a
leaked tmpfs file shows in the env's footprint, a spike that exited does not. The test
plays the controller (grow or kill on a pause).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from arl_tangram.managers.cpu import memory_watch
from arl_tangram.managers.cpu.config import SandboxSpec
from arl_tangram.managers.cpu.manager import CpuManager
from tests.managers.cpu.conftest import needs_root

pytestmark = needs_root

MIB = 1 << 20
# allocates and touches ~100 MiB (a bytes object is filled as it is made)
HOG = "python3 -c \"b = b'x' * (100 << 20); print('ok', len(b) >> 20)\""
# touches 300 MiB (every page written), prints a checksum, exits: the spike of a profiler
SPIKE = "python3 -c \"b = bytearray(b'x') * (300 << 20); print(sum(b[:: 1 << 16]))\""
# writes 200 MiB of file data into the sandbox's tmpfs /tmp: charged by write(), not a fault
WRITER = "head -c 200M /dev/zero > /tmp/big && echo wrote"
ROOMY = SandboxSpec(mem_bytes=512 * MIB, pids_max=128, workspace_bytes=16 * MIB, tmp_bytes=256 * MIB)


@pytest.fixture
def roomy(manager: CpuManager) -> Iterator[str]:
    """A sandbox whose /tmp and limit hold the writer's 200 MiB."""
    sid = manager.create_sandbox(ROOMY)
    yield sid
    manager.destroy_sandbox(sid)


def _controller(after_s: float, act: Callable[[], object]) -> tuple[Callable[[int], None], list[int]]:
    """A pause callback that answers each pause with ``act`` after ``after_s``, from
    another thread (as the controller's decision would come)."""
    seen: list[int] = []

    def on_paused(usage_bytes: int) -> None:
        seen.append(usage_bytes)
        timer = threading.Timer(after_s, act)
        timer.daemon = True
        timer.start()

    return on_paused, seen


def test_over_its_grant_an_action_pauses_and_resumes_when_memory_is_granted(manager: CpuManager, sandbox: str) -> None:
    on_paused, seen = _controller(0.3, lambda: manager.grow_memory(sandbox, 200 * MIB))
    res = manager.exec(sandbox, HOG, mem_limit_bytes=48 * MIB, on_memory_paused=on_paused, timeout_s=30)
    assert res.outcome == "succeeded", (res.outcome, res.stderr_text)
    assert res.stdout_text.strip() == "ok 100"
    assert seen and seen[0] >= 40 * MIB  # it paused at its 48 MiB limit
    assert res.paused_s >= 0.25
    assert res.footprint_bytes is not None


def test_past_its_env_limit_it_ends_oom_killed_and_the_env_works_again(manager: CpuManager, sandbox: str) -> None:
    on_paused, seen = _controller(0.1, lambda: manager.oom_kill(sandbox))
    res = manager.exec(sandbox, HOG, mem_limit_bytes=64 * MIB, on_memory_paused=on_paused, timeout_s=30)
    assert seen and res.outcome == "oom_killed", (res.outcome, res.stderr_text)
    nxt = manager.exec(sandbox, "echo fine", mem_limit_bytes=32 * MIB, on_memory_paused=lambda _: None, timeout_s=10)
    assert nxt.outcome == "succeeded" and nxt.stdout_text.strip() == "fine"


def test_paused_time_does_not_count_against_the_timeout(manager: CpuManager, sandbox: str) -> None:
    # Paused longer than the whole timeout: counted, the pause alone would time it out. The
    # 2 s timeout leaves the run's own second (Python's start, the allocation, the sleep)
    # room on a loaded host.
    on_paused, seen = _controller(2.5, lambda: manager.grow_memory(sandbox, 200 * MIB))
    cmd = HOG + " && sleep 0.2"
    res = manager.exec(sandbox, cmd, mem_limit_bytes=48 * MIB, on_memory_paused=on_paused, timeout_s=2.0)
    assert seen and res.outcome == "succeeded", (res.outcome, res.paused_s, res.wall_s)
    assert res.wall_s > 2.0 and res.paused_s >= 2.4


def test_a_leaked_tmpfs_file_grows_the_env_footprint(manager: CpuManager, sandbox: str) -> None:
    before = manager.footprint_bytes(sandbox)
    res = manager.exec(
        sandbox, "head -c 24M /dev/zero > /tmp/leak", mem_limit_bytes=200 * MIB, on_memory_paused=lambda _: None, timeout_s=10
    )  # fmt: skip
    assert res.outcome == "succeeded", res.stderr_text
    assert res.footprint_bytes is not None
    # v1's memory.stat is flushed lazily (up to ~2 s behind): the leak shows within seconds
    deadline = time.monotonic() + 10.0
    while manager.footprint_bytes(sandbox) < before + 24 * MIB and time.monotonic() < deadline:
        time.sleep(0.1)
    assert manager.footprint_bytes(sandbox) >= before + 24 * MIB


def test_a_spike_that_exited_is_not_counted_in_the_footprint_measured_right_after(manager: CpuManager, roomy: str) -> None:
    """v1's memory.stat can lag the exit of a 300 MiB allocation by up to ~2 s (more often
    while another reader flushes the stats, as the node's memory poll does); the footprint
    reported with the result must not charge those freed pages to the idle env (a stale
    spike, charged, starved the next grant into a memory-deadlock kill)."""
    stop = threading.Event()
    stat = os.path.join(manager.driver.memory_dirs()[0], "memory.stat")

    def poll_like_the_node() -> None:
        while not stop.is_set():
            with open(stat) as f:
                f.read()

    poller = threading.Thread(target=poll_like_the_node, daemon=True)
    poller.start()
    try:
        before = manager.footprint_bytes(roomy)
        # 32 MiB of slack for page cache a run may charge here; a stale figure is 60-340 MiB,
        # and it shows in a third to half of the tries: sixteen leave it little room to hide
        for _ in range(16):
            res = manager.exec(roomy, SPIKE, mem_limit_bytes=400 * MIB, on_memory_paused=lambda _: None, timeout_s=30)
            assert res.outcome == "succeeded", res.stderr_text
            assert res.footprint_bytes is not None and res.footprint_bytes <= before + 32 * MIB, res.footprint_bytes
    finally:
        stop.set()
        poller.join()


def test_a_tmpfs_write_over_its_grant_pauses_and_grows_instead_of_failing(manager: CpuManager, roomy: str) -> None:
    on_paused, seen = _controller(0.2, lambda: manager.grow_memory(roomy, 400 * MIB))
    res = manager.exec(roomy, WRITER, mem_limit_bytes=32 * MIB, on_memory_paused=on_paused, timeout_s=30)
    assert res.outcome == "succeeded" and res.stdout_text.strip() == "wrote", (res.outcome, res.stderr_text[-400:])
    assert seen and 32 * MIB <= seen[0] <= 160 * MIB  # paused over its 32 MiB grant, by a bounded overshoot
    assert res.paused_s >= 0.15


def test_at_a_hard_limit_at_its_grant_the_same_write_fails_with_enomem(
    manager: CpuManager, roomy: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """What the soft grant replaces: with no room the hard limit is the grant (the previous
    mechanism: pause at it, OOM killer off), and the write fails with ENOMEM although the
    controller grows every pause and the env's limit has room."""
    monkeypatch.setattr(memory_watch, "HARD_LIMIT_ROOM_BYTES", 0)
    on_paused, _ = _controller(0.2, lambda: manager.grow_memory(roomy, 400 * MIB))
    res = manager.exec(roomy, WRITER, mem_limit_bytes=32 * MIB, on_memory_paused=on_paused, timeout_s=30)
    assert res.outcome == "failed" and "Cannot allocate memory" in res.stderr_text, (res.outcome, res.stderr_text[-400:])


def test_a_crossing_before_the_v1_threshold_is_registered_still_pauses(
    manager: CpuManager, roomy: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """v1 registers a usage threshold inside an RCU grace period (8-25 ms a run here), so it
    is armed off the run's path and the pump reads the usage until it is (``memory_watch``).
    Here every arming is held back for the whole run, and the write starts after the pump's
    first look at a fresh grant: it still pauses at its grant, and no registration ran on
    the run's path."""
    if manager.driver.version != 1:
        pytest.skip("v1 usage thresholds")
    held: list[Callable[[], None]] = []

    class HeldBack:
        def submit(self, arm: Callable[[], None]) -> None:
            held.append(arm)

    monkeypatch.setattr(memory_watch, "_arming_pool", HeldBack)
    on_paused, seen = _controller(0.2, lambda: manager.grow_memory(roomy, 400 * MIB))
    try:
        res = manager.exec(roomy, "sleep 0.3 && " + WRITER, mem_limit_bytes=32 * MIB, on_memory_paused=on_paused, timeout_s=30)
    finally:
        for arm in held:  # the closed watches' fds close once their arming ends
            arm()
    assert held, "the threshold was registered on the run's path"
    assert res.outcome == "succeeded" and res.stdout_text.strip() == "wrote", (res.outcome, res.stderr_text[-400:])
    assert seen and 32 * MIB <= seen[0] <= 160 * MIB  # paused over its grant by a bounded overshoot
