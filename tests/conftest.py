"""Suite-wide fixtures: every test must leave no process, cgroup, mount or temp dir behind.

Convention for everything the project creates on the host: cgroups, mounts and temp dirs
carry ``arl-tangram-<pid>`` in their name (``<pid>`` = the process that created them), so
this check finds leftovers without knowing which manager made them. It looks only at what
*this* test run created: this process's descendants, cgroups and temp dirs named after this
process or one of its descendants, and this process's own mount table, so concurrent runs on
the same host (other checkouts, other agents) never make it flaky.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
import time
from collections.abc import Iterator

import psutil
import pytest

LEAK_MARK = "arl-tangram"
_PID_IN_NAME = re.compile(rf"{LEAK_MARK}-(\d+)")
_OURS: set[int] = {os.getpid()}  # this process and every descendant seen so far


def _child_pids() -> set[int]:
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return set()
    pids = set()
    for c in children:
        try:
            if c.status() != psutil.STATUS_ZOMBIE:
                pids.add(c.pid)
        except psutil.Error:
            continue
    _OURS.update(pids)
    return pids


def _ours(name: str) -> bool:
    match = _PID_IN_NAME.search(os.path.basename(name))
    return match is not None and int(match.group(1)) in _OURS


def _cgroups() -> set[str]:
    found: set[str] = set()
    for depth in range(1, 6):
        pattern = "/sys/fs/cgroup/" + "/".join(["*"] * depth)
        found.update(p for p in glob.glob(pattern) if LEAK_MARK in os.path.basename(p) and _ours(p) and os.path.isdir(p))
    return found


def _mounts() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return {line.split()[4] for line in f if LEAK_MARK in line.split()[4]}


def _temp_dirs() -> set[str]:
    return {p for p in glob.glob(os.path.join(tempfile.gettempdir(), f"{LEAK_MARK}*")) if _ours(p)}


def _snapshot() -> dict[str, set]:
    processes = _child_pids()  # first: it records descendants the other checks attribute
    return {"processes": processes, "cgroups": _cgroups(), "mounts": _mounts(), "temp dirs": _temp_dirs()}


def assert_nothing_left_since(before: dict[str, set], who: str = "test", grace_s: float = 5.0) -> None:
    """Fail if processes, cgroups, mounts or temp dirs of this run appeared since ``before``
    (a ``_snapshot()``) and are still there after ``grace_s`` (exits take a moment)."""
    deadline = time.monotonic() + grace_s
    while True:
        after = _snapshot()
        leaked = {k: sorted(map(str, after[k] - before[k])) for k in after if after[k] - before[k]}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"{who} left resources behind: {leaked}"


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail a test that leaves processes, cgroups, mounts or temp dirs of this run behind."""
    before = _snapshot()
    yield
    assert_nothing_left_since(before)


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (``pytest.mark.anyio``) run on asyncio."""
    return "asyncio"


@pytest.fixture
def sandbox_host() -> None:
    """Real sandboxes need root and bubblewrap; under CI they are never skipped."""
    from tests.managers.cpu.conftest import IN_CI, host_can_sandbox

    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")


_EXIT_STATUS: list[int] = []  # pytest's own exit status, kept for ``pytest_unconfigure``


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the process with pytest's own exit status once every report is written, without
    the interpreter's teardown. Why: after a whole suite had passed (1047 tests), a native
    thread of a third-party library (a segfault in libstdc++) crashed while the interpreter
    tore down its modules, and the crash, not the suite, set ``make test``'s status. Every
    test's own cleanup and the leftover checks have run by then (they are fixtures)."""
    if _EXIT_STATUS:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
