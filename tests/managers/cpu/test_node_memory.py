"""The node's measured free memory (issue 21, memory pressure) on group files laid out as
cgroup v2 and v1 write them (a directory of plain files: this host has no v2 hierarchy);
the live test on real v1 groups is tests/runtime/test_mem_pressure_live.py."""

from __future__ import annotations

from pathlib import Path

from arl_tangram.managers.cpu import node_memory

MIB = 1 << 20
PSI = "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=4\n"


def _host_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 1 << 62


def _group(d: Path, files: dict[str, str]) -> str:
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return str(d)


def test_v2_groups_give_the_tightest_free_memory_and_psi(tmp_path: Path) -> None:
    budget = _group(tmp_path / "budget", {"memory.max": f"{300 * MIB}\n", "memory.current": f"{250 * MIB}\n",
                                          "memory.stat": f"anon 1\ninactive_file {30 * MIB}\n"})  # fmt: skip
    root = _group(tmp_path / "budget" / "root", {"memory.max": "max\n", "memory.current": f"{200 * MIB}\n",
                                                 "memory.stat": "anon 1\n", "memory.pressure": PSI})  # fmt: skip
    seen = node_memory.measure((root, budget), node_mem_bytes=1024 * MIB)
    # root: capped at the node's 1 GiB -> 824 MiB free; budget: 300 - (250 - 30) = 80 MiB
    assert seen.free_bytes == min(80 * MIB, _host_available())
    assert seen.some_avg10 == 12.5


def test_v1_groups_and_no_psi(tmp_path: Path) -> None:
    root = _group(tmp_path / "root", {"memory.limit_in_bytes": str(1 << 62), "memory.usage_in_bytes": str(100 * MIB),
                                      "memory.stat": f"total_inactive_file {20 * MIB}\n"})  # fmt: skip
    seen = node_memory.measure((root,), node_mem_bytes=256 * MIB)
    assert seen.free_bytes == min(176 * MIB, _host_available()) and seen.some_avg10 is None  # 256 - (100 - 20)
