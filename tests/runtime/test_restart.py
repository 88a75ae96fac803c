"""``kill -9`` of a service process with a journal: its sandboxes, cgroups and processes are
cleaned up (the CPU manager's keeper, or the next manager's startup sweep), and a restarted
service gives every action the dead one accepted an outcome: the running one and the one
bound to an env end ``error`` / ``service_restarted``; the one that never started re-runs."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from arl_tangram.runtime.embedded import EmbeddedRuntime
from tests import conftest as suite
from tests.runtime.builders import NOOP, config, noop_spec

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
REPO = Path(__file__).resolve().parents[2]


def _start_child(journal: Path) -> tuple[subprocess.Popen[bytes], dict]:  # type: ignore[type-arg]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.crash_child", str(journal)], cwd=REPO, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=90.0)
    if not ready:
        proc.kill()
        proc.wait()
        pytest.fail("the service process did not get its actions running in time")
    line = proc.stdout.readline()
    return proc, json.loads(line)


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.Error:
            continue
    return alive


def _cgroups_of(pid: int) -> list[str]:
    return [p for depth in range(1, 6) for p in glob.glob("/sys/fs/cgroup/" + "/*" * (depth - 1) + f"/arl-tangram-{pid}-*")]


async def test_kill_9_leaves_nothing_behind_and_every_action_an_outcome(tmp_path: Path) -> None:
    journal = tmp_path / "journal.sqlite"
    proc, info = _start_child(journal)
    descendants = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    suite._child_pids()  # the suite's leak check now covers the dead service's cgroups too
    assert info["pid"] == proc.pid and _cgroups_of(proc.pid), "the service process runs real sandboxes"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()

    runtime = await EmbeddedRuntime.start(config(journal_path=str(journal)))
    try:
        c = runtime.controller
        ids = info["ids"]
        for label in ("running", "queued_env"):
            ended = await c.wait(ids[label], 10.0)
            assert ended.outcome == "error" and (ended.cause or "").startswith("service_restarted"), (label, ended)
        assert (await c.wait(ids["queued_free"], 10.0)).ok  # never started: run by the new service
        assert c.submit(noop_spec(), NOOP, request_id="queued-free").spec.action_id == ids["queued_free"]
        assert not set(info["envs"]) & set(c.env_specs)  # envs do not survive a restart
        deadline = time.monotonic() + 15.0
        while (_alive(descendants) or _cgroups_of(proc.pid)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not _alive(descendants), "processes of the killed service survived"
        assert not _cgroups_of(proc.pid), "cgroups of the killed service survived"
    finally:
        await runtime.aclose()
