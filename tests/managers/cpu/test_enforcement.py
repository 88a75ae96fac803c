"""Allocate-on-Execution for real: idle sandboxes use no CPU, a grant of N cores gives N."""

from __future__ import annotations

import time

from arl_tangram.managers.cpu.manager import CpuManager

BUSY2 = "for i in 1 2 3; do timeout {s} sh -c 'while :; do :; done' & done; wait"


def test_idle_sandbox_with_busy_loop_uses_no_cpu(manager: CpuManager, any_sandbox: str) -> None:
    """On the host root and on an image root: the freezer holds an idle sandbox at zero CPU."""
    r = manager.exec(any_sandbox, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &", background=True)
    assert r.ok
    sb = manager.get_sandbox(any_sandbox)
    time.sleep(0.2)  # let the freeze settle
    before = manager.driver.sandbox_cpu_ns(sb.group)
    time.sleep(1.0)
    used_cores = (manager.driver.sandbox_cpu_ns(sb.group) - before) / 1e9
    assert used_cores < 0.02
    # the loop is frozen, not dead: it runs again during the next action
    assert manager.exec(any_sandbox, "pgrep -c -f 'while :' ").stdout.strip() != b"0"


def test_busy_action_gets_the_granted_cores(manager: CpuManager, sandbox: str) -> None:
    """Three busy processes granted N cores never use more than N; the lower bound is loose
    because other work on this small shared host competes for the same cpus."""
    for cores in sorted({1, len(manager.topology.cpus)}):
        r = manager.exec(sandbox, BUSY2.format(s=1.0), cores=cores, timeout_s=30)
        assert r.ok
        used = r.cpu_s / r.wall_s
        assert used <= 1.1 * cores, (cores, used)
        if cores == 1:
            assert used >= 0.5, used


def test_grant_is_applied_while_the_action_runs(manager: CpuManager, sandbox: str) -> None:
    r = manager.exec(sandbox, "cat /proc/self/status | grep Cpus_allowed_list; echo $TANGRAM_DOP", cores=1)
    assert r.stdout_text.split()[1:] == [str(r.cpus[0]), "1"]
    sb = manager.get_sandbox(sandbox)
    grant = manager.grant(sandbox, 1)
    try:
        quota = manager.driver._dirs["cpu"] if hasattr(manager.driver, "_dirs") else None  # type: ignore[attr-defined]
        if quota is not None:
            with open(f"{quota}/{sb.group}/cpu.cfs_quota_us", encoding="ascii") as f:
                assert f.read().strip() == "100000"
    finally:
        manager.reclaim(grant)
