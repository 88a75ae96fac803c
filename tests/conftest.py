"""Suite-wide fixtures: every test must leave no process, cgroup, mount or temp dir behind.

Convention for everything the project creates on the host: cgroups, mounts and temp dirs
carry ``arl-tangram`` in their name, so this check can find leftovers without knowing
which manager made them.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time
from collections.abc import Iterator

import psutil
import pytest

LEAK_MARK = "arl-tangram"


def _child_pids() -> set[int]:
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return set()
    return {c.pid for c in children if c.status() != psutil.STATUS_ZOMBIE}


def _cgroups() -> set[str]:
    found: set[str] = set()
    for depth in range(1, 6):
        pattern = "/sys/fs/cgroup/" + "/".join(["*"] * depth)
        found.update(p for p in glob.glob(pattern) if LEAK_MARK in os.path.basename(p) and os.path.isdir(p))
    return found


def _mounts() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return {line.split()[4] for line in f if LEAK_MARK in line.split()[4]}


def _temp_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"{LEAK_MARK}*")))


def _snapshot() -> dict[str, set]:
    return {"processes": _child_pids(), "cgroups": _cgroups(), "mounts": _mounts(), "temp dirs": _temp_dirs()}


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail a test that leaves processes, cgroups, mounts or temp dirs of the project behind."""
    before = _snapshot()
    yield
    deadline = time.monotonic() + 5.0
    while True:
        after = _snapshot()
        leaked = {k: sorted(map(str, after[k] - before[k])) for k in after if after[k] - before[k]}
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not leaked, f"test left resources behind: {leaked}"
