"""The cgroup file helpers read a group removed under them as gone, whichever way it shows."""

from __future__ import annotations

import errno
import os

import pytest

from arl_tangram.managers.cpu import cgroup_fs


@pytest.mark.parametrize("exc", [FileNotFoundError(errno.ENOENT, "gone"), OSError(errno.ENODEV, "No such device")])
def test_a_group_removed_before_or_during_the_read_reads_as_gone(monkeypatch: pytest.MonkeyPatch, exc: OSError) -> None:
    def fail(path: str) -> str:
        raise exc

    monkeypatch.setattr(cgroup_fs, "read_text", fail)
    assert cgroup_fs.read_keyed("/x/memory.oom_control") == {}
    assert cgroup_fs.read_int("/x/cpuacct.usage", default=7) == 7
    assert cgroup_fs.read_pids("/x/cgroup.procs") == []


def test_other_errors_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: str) -> str:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(cgroup_fs, "read_text", denied)
    with pytest.raises(PermissionError):
        cgroup_fs.read_keyed("/x/memory.oom_control")
