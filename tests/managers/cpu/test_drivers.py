"""cgroup detection (recorded host files) and the v2 driver against a fake cgroupfs tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.cgroup_detect import (
    detect_driver,
    parse_mountinfo,
    v1_parents,
    v2_parent,
)
from arl_tangram.managers.cpu.cgroup_driver import format_cpus, parse_cpus
from arl_tangram.managers.cpu.cgroups_v2 import CgroupV2Driver
from arl_tangram.managers.cpu.errors import CgroupUnavailableError
from arl_tangram.managers.cpu.manager import CpuManager

THIS_HOST_CGROUP = """9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/abc
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""
THIS_HOST_MOUNTINFO = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
PURE_V2_CGROUP = "0::/user.slice/job\n"
PURE_V2_MOUNTINFO = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_v1_parents_follow_own_paths_per_controller() -> None:
    parents, missing = v1_parents(THIS_HOST_CGROUP, THIS_HOST_MOUNTINFO)
    assert missing == []
    assert parents["memory"] == "/sys/fs/cgroup/memory/process_api/abc"
    assert parents["cpu"] == "/sys/fs/cgroup/cpu" and parents["cpuacct"] == "/sys/fs/cgroup/cpuacct"


def test_comounted_cpu_cpuacct_share_a_directory() -> None:
    info = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    mounts = parse_mountinfo(info)
    assert mounts[0].controllers == frozenset({"cpu", "cpuacct"})


def test_pure_v2_host_gives_unified_parent() -> None:
    assert v1_parents(PURE_V2_CGROUP, PURE_V2_MOUNTINFO)[1]  # v1 missing everything
    assert v2_parent(PURE_V2_CGROUP, PURE_V2_MOUNTINFO) == "/sys/fs/cgroup/user.slice/job"


def test_detection_refuses_with_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("0::/\n")
    (tmp_path / "mountinfo").write_text("1 0 0:1 / / rw - ext4 /dev/vda rw\n")
    with pytest.raises(CgroupUnavailableError, match="unisolated=True"):
        detect_driver("arl-tangram-test", proc_root=str(tmp_path))


def test_cpulist_round_trip() -> None:
    assert format_cpus([5, 0, 1, 2]) == "0-2,5"
    assert parse_cpus("0-2,5\n") == (0, 1, 2, 5)


@pytest.fixture
def fake_v2(tmp_path: Path) -> Path:
    """A fake delegated cgroup2 directory: files the kernel would provide, as plain files."""
    parent = tmp_path / "delegated"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cpuset.cpus.effective").write_text("0-3\n")
    return parent


def _make_files(d: Path, **files: str) -> None:
    for name, text in files.items():
        (d / name.replace("_", ".", 1)).write_text(text)


def test_v2_driver_writes_the_interface_files(fake_v2: Path) -> None:
    drv = CgroupV2Driver(str(fake_v2), "arl-tangram-t")
    drv.create_root()
    root = fake_v2 / "arl-tangram-t"
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "+cpu +cpuset +memory +pids"
    assert (root / "cpu.weight").read_text() == "400"  # 4 cpus: the sandboxes weigh as 4 threads together
    drv.create_sandbox("sb-1", 64 << 20, 100, [0, 1])
    sb = root / "sb-1"
    assert (sb / "memory.max").read_text() == str(64 << 20)
    assert (sb / "pids.max").read_text() == "100"
    assert (sb / "cpuset.cpus").read_text() == "0-1"
    assert (sb / "cpu.max").read_text() == "1000 100000"
    assert (sb / "init").is_dir()
    drv.set_grant("sb-1", [1], 2 * 100_000)
    assert (sb / "cpu.max").read_text() == "200000 100000"
    assert (sb / "cpuset.cpus").read_text() == "1"
    drv.freeze("sb-1")
    assert (sb / "cgroup.freeze").read_text() == "1"
    drv.thaw("sb-1")
    assert (sb / "cgroup.freeze").read_text() == "0"
    assert drv.join_files("sb-1", "init") == (str(sb / "init" / "cgroup.procs"),)


def test_v2_driver_accounting_and_kill(fake_v2: Path) -> None:
    drv = CgroupV2Driver(str(fake_v2), "arl-tangram-t")
    drv.create_root()
    drv.create_sandbox("sb-1", 64 << 20, 100, [0])
    drv.create_slot("sb-1", "a0")
    slot = fake_v2 / "arl-tangram-t" / "sb-1" / "a0"
    _make_files(slot, cpu_stat="usage_usec 1000\nuser_usec 600\n", memory_peak="4096\n", cgroup_procs="")
    drv.reset_slot_counters("sb-1", "a0")
    (slot / "cpu.stat").write_text("usage_usec 251000\n")
    assert drv.slot_cpu_ns("sb-1", "a0") == 250_000_000
    (fake_v2 / "arl-tangram-t" / "sb-1" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert drv.oom_kills("sb-1") == 1
    assert drv.kill_slot("sb-1", "a0") == 0  # nothing listed: nothing left
    assert (slot / "cgroup.freeze").read_text() == "0"  # thawed after the kill round
    assert (slot / "cpu.max").read_text() == "max 100000"  # quota lifted so the killed can exit
    assert drv.slot_pids("sb-1", "a0") == []


def test_v2_driver_refuses_without_delegated_controllers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("io memory\n")
    with pytest.raises(CgroupUnavailableError, match="cpu"):
        CgroupV2Driver(str(tmp_path), "arl-tangram-t").create_root()
    assert not os.path.exists(tmp_path / "arl-tangram-t")


def test_v2_driver_memory_per_action(fake_v2: Path) -> None:
    """Pause-and-grow on v2 (as far as a fake tree shows it), the same protocol as v1's: the
    grant is armed softly as ``memory.high`` under the env's ``memory.max`` (the kernel
    throttles, never fails a charge, so nothing is frozen); a rise of ``memory.events``'
    ``high`` count is a pause, reported with ``memory.current``; ending it as an OOM kill
    drops ``memory.max`` to the grant, and closing the watch gives the env its limit back;
    the footprint is anon + shmem, at most ``memory.current``."""
    drv = CgroupV2Driver(str(fake_v2), "arl-tangram-t")
    drv.create_root()
    drv.create_sandbox("sb-1", 256 << 20, 100, [0])
    sb = fake_v2 / "arl-tangram-t" / "sb-1"
    (sb / "memory.events").write_text("low 0\nhigh 2\nmax 0\noom 0\noom_kill 0\n")
    (sb / "memory.current").write_text(f"{50 << 20}\n")
    watch = drv.open_memory_watch("sb-1", 48 << 20, 256 << 20)
    try:
        assert (sb / "memory.high").read_text() == str(48 << 20)
        assert (sb / "memory.max").read_text() == str(256 << 20)
        assert not watch.consume()  # no new throttling since it opened
        (sb / "memory.events").write_text("low 0\nhigh 5\nmax 0\noom 0\noom_kill 0\n")
        assert watch.consume() and not watch.consume()
        assert watch.stop_for_grant() == 50 << 20
        watch.end_as_oom()
        assert (sb / "memory.max").read_text() == str(48 << 20)
    finally:
        watch.close()
    assert (sb / "memory.max").read_text() == str(256 << 20)
    drv.set_memory_pause("sb-1", False)  # nothing to switch on v2
    assert (sb / "memory.max").read_text() == str(256 << 20)
    (sb / "memory.stat").write_text("anon 1000\nfile 99999\nshmem 24\n")
    assert drv.sandbox_footprint_bytes("sb-1") == 1024
    (sb / "memory.current").write_text("512\n")  # the stat lags a freed spike: the exact counter caps it
    assert drv.sandbox_footprint_bytes("sb-1") == 512


def test_the_v1_root_group_weighs_1024_per_cpu_it_manages(manager: CpuManager) -> None:
    """At v1's default weight every sandbox together weighed one thread of the server or of a
    client on the host: a burst of answers and retries starved the runs (issue 26)."""
    if manager.driver.version != 1:
        pytest.skip("reads cgroup v1 cpu.shares")
    cpus = Path(manager.driver._path("cpuset", "cpuset.cpus")).read_text()  # type: ignore[attr-defined]
    shares = int(Path(manager.driver._path("cpu", "cpu.shares")).read_text())  # type: ignore[attr-defined]
    assert shares == 1024 * len(parse_cpus(cpus.strip()))
