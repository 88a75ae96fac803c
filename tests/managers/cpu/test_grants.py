"""The controller's API: ids it chooses, grants it names (millicores per NUMA domain, DoP),
holdings (Guaranteed / Burstable), session grants, and races ending in defined outcomes."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arl_tangram.managers.cpu.config import CpuManagerConfig
from arl_tangram.managers.cpu.errors import InvalidRequestError, SandboxNotFoundError
from arl_tangram.managers.cpu.manager import CpuManager, ManagerClosedError
from arl_tangram.managers.cpu.results import Outcome

LOOP = "timeout {s} sh -c 'while :; do :; done'; true"


def test_sandbox_under_the_controllers_id(manager: CpuManager) -> None:
    sid = manager.create_sandbox(sandbox_id="env-7.a_b")
    try:
        assert sid == "env-7.a_b"
        assert manager.exec(sid, "echo $TANGRAM_SANDBOX_ID").stdout == b"env-7.a_b\n"
        with pytest.raises(InvalidRequestError, match="sandbox_id.*live"):
            manager.create_sandbox(sandbox_id="env-7.a_b")
    finally:
        manager.destroy_sandbox(sid)
    for bad in ("", "a/b", "x" * 65, "sp ace"):
        with pytest.raises(InvalidRequestError, match="sandbox_id"):
            manager.create_sandbox(sandbox_id=bad)


def test_grant_is_exactly_what_the_caller_names(manager: CpuManager, sandbox: str) -> None:
    assert manager.numa_cores() == tuple(len(c) for c in manager.topology.domains)
    n = len(manager.topology.cpus)
    r = manager.exec(sandbox, "echo $TANGRAM_DOP $(nproc)", numa_millicores=[n * 1000])
    assert r.stdout.split() == [str(n).encode()] * 2 and r.millicores == n * 1000 and len(r.cpus) == n
    r = manager.exec(sandbox, "echo $TANGRAM_DOP $(nproc)", millicores=1500 if n > 1 else 500, dop=7)
    assert r.stdout.split() == [b"7", str(min(2, n)).encode()]
    r = manager.exec(sandbox, LOOP.format(s=1), millicores=300)
    assert 0.15 < r.cpu_s / r.wall_s < 0.45, r  # the CFS quota is the millicores, not whole cores
    for kwargs, field in (({"millicores": 0}, "millicores"), ({"numa_millicores": [n * 1000 + 1]}, "numa_millicores"),
                          ({"numa_millicores": [1000] * 9}, "numa_millicores"), ({"millicores": 1000, "cores": 2}, "cores")):  # fmt: skip
        with pytest.raises(InvalidRequestError, match=field):
            manager.exec(sandbox, "true", **kwargs)  # type: ignore[arg-type]
    assert manager.core_load() == dict.fromkeys(manager.topology.cpus, 0)


def test_concurrent_actions_each_see_their_own_cpus(manager: CpuManager, sandbox: str) -> None:
    """Issue 9 item 5: nproc = TANGRAM_DOP = the action's cgroup, even with several running."""
    bad: list[bytes] = []

    def run(cores: int) -> None:
        for _ in range(6):
            r = manager.exec(sandbox, "sleep 0.05; echo $TANGRAM_DOP $(nproc) $(cat /proc/self/status | grep -c x)", cores=cores)
            dop, nproc = r.stdout.split()[:2]
            if dop != nproc or int(nproc) != len(r.cpus):
                bad.append(r.stdout)

    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(run, 1 + i % 2) for i in range(4)]:
            done.result()  # a run that raised fails the test (a lost thread once hid an EINVAL)
    assert not bad


def test_an_ended_runs_larger_quota_never_blocks_lowering_the_sandboxs(manager: CpuManager, sandbox: str) -> None:
    """cgroup v1 refuses a sandbox quota below a slot's: a 1.5-core run that ends while a
    0.3-core one goes on leaves its empty slot at 1.5 cores, and the sandbox's quota then
    drops to 0.3 cores (fix: the empty slot's quota is lifted first, ``_lift_stale_quota``)."""
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(manager.exec, sandbox, "sleep 1; echo slow", millicores=300)
        time.sleep(0.3)
        assert manager.exec(sandbox, "echo fast", millicores=1500).stdout == b"fast\n"
        assert slow.result().stdout == b"slow\n"
        assert manager.exec(sandbox, "echo again", millicores=1500).stdout == b"again\n"


def test_guaranteed_holding_is_a_real_limit_and_zero_grants_run_within_it(manager: CpuManager, sandbox: str) -> None:
    manager.exec(sandbox, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &", background=True)
    group = manager.get_sandbox(sandbox).group
    manager.hold(sandbox, 500)
    assert manager.sandbox_info(sandbox).state == "held"
    time.sleep(0.3)
    c0 = manager.driver.sandbox_cpu_ns(group)
    time.sleep(1.0)
    used = (manager.driver.sandbox_cpu_ns(group) - c0) / 1e9
    assert 0.3 < used < 0.65, used  # not frozen while idle, and limited to the holding
    r = manager.exec(sandbox, "echo $(nproc)", millicores=0)
    assert r.ok and r.stdout == b"1\n"
    manager.release_hold(sandbox)
    assert manager.sandbox_info(sandbox).state == "idle"
    time.sleep(0.2)
    c0 = manager.driver.sandbox_cpu_ns(group)
    time.sleep(0.5)
    assert (manager.driver.sandbox_cpu_ns(group) - c0) / 1e9 < 0.02  # frozen again
    with pytest.raises(InvalidRequestError, match="holding"):
        manager.exec(sandbox, "true", millicores=0)
    assert manager.core_load() == dict.fromkeys(manager.topology.cpus, 0)


def test_burstable_holding_has_no_quota(manager: CpuManager, sandbox: str) -> None:
    manager.hold(sandbox, 200, limit=False)
    r = manager.exec(sandbox, LOOP.format(s=1), millicores=0)
    assert r.cpu_s / r.wall_s > 0.5, r  # a request, not a limit
    manager.release_hold(sandbox)


def test_session_runs_take_the_named_grant(manager: CpuManager, sandbox: str) -> None:
    session = manager.open_session(sandbox)
    r = manager.run_in_session(session, "echo $TANGRAM_DOP $(nproc)", millicores=1000, dop=3)
    assert r.stdout == b"3 1\n" and r.millicores == 1000
    r = manager.run_in_session(session, LOOP.format(s=1), millicores=250)
    assert 0.1 < r.cpu_s / r.wall_s < 0.4, r
    manager.close_session(session)


def test_destroy_during_exec_and_session_run_ends_cancelled(manager: CpuManager) -> None:
    sid = manager.create_sandbox()
    session = manager.open_session(sid)
    box: dict[str, object] = {}
    workers = [
        threading.Thread(target=lambda: box.update(exec=manager.exec(sid, "sleep 30"))),
        threading.Thread(target=lambda: box.update(sess=manager.run_in_session(session, "sleep 30"))),
    ]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 10  # both runs granted (a loaded host starts threads late)
    while manager.sandbox_info(sid).granted_millicores < 2000 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    manager.destroy_sandbox(sid)
    for w in workers:
        w.join(10)
    assert box["exec"].outcome is Outcome.CANCELLED, box  # type: ignore[attr-defined]
    assert box["sess"].outcome is Outcome.CANCELLED, box  # type: ignore[attr-defined]
    with pytest.raises(SandboxNotFoundError):
        manager.run_in_session(session, "true")


def test_close_session_during_a_run(manager: CpuManager, sandbox: str) -> None:
    session = manager.open_session(sandbox)
    box: dict[str, object] = {}
    w = threading.Thread(target=lambda: box.update(r=manager.run_in_session(session, "sleep 30")))
    w.start()
    time.sleep(0.4)
    manager.close_session(session)
    w.join(10)
    assert box["r"].outcome is Outcome.CANCELLED  # type: ignore[attr-defined]
    assert manager.exec(sandbox, "echo ok").stdout == b"ok\n"


def test_close_during_create_undoes_the_create(manager: CpuManager) -> None:
    mgr = CpuManager(CpuManagerConfig(default_spec=manager.config.default_spec))
    box: dict[str, object] = {}

    def create() -> None:
        try:
            box["sid"] = mgr.create_sandbox()
        except ManagerClosedError as exc:
            box["err"] = exc

    w = threading.Thread(target=create)
    w.start()
    time.sleep(0.005)
    mgr.close()
    w.join(10)
    assert "err" in box or "sid" in box
    assert not mgr.list_sandboxes()
