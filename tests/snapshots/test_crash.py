"""``kill -9`` during a snapshot's write leaves the old state or the new one, never a half
layer: the store's recovery (run when it opens) removes what the killed writer left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.snapshot_store import SnapshotStore

pytestmark = pytest.mark.usefixtures("sandbox_host")
WRITER = """
import sys
from pathlib import Path
from arl_tangram.managers.cpu.snapshot_store import SnapshotRecord, SnapshotStore
store = SnapshotStore(Path(sys.argv[1]))
sid = sys.argv[3]
store.commit(SnapshotRecord(sid, "t", "", "e", "img", "sha256:" + "0" * 64, (sid,)), sys.argv[2])
print("committed", flush=True)
"""


def _upper(root: Path, files: int) -> Path:
    root.mkdir()
    for i in range(files):
        (root / f"f{i}").write_bytes(os.urandom(256 << 10))
    return root


def test_kill_9_mid_write_leaves_the_old_state_and_no_orphan(tmp_path: Path) -> None:
    upper = _upper(tmp_path / "upper", 200)  # 50 MiB: the copy takes a while
    store_dir = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(store_dir), str(upper), "snap-killed01"], env=env,
                              start_new_session=True)  # fmt: skip  (its group: the writer and its cp)
    try:
        deadline = time.monotonic() + 30
        while not (store_dir / ".tmp-snap-killed01" / "layer").exists():
            assert writer.poll() is None and time.monotonic() < deadline, "the writer never started its copy"
            time.sleep(0.005)
    finally:
        os.killpg(writer.pid, signal.SIGKILL)  # kill -9 of the writer and its copy, mid-way
        writer.wait()
    time.sleep(0.1)
    store = SnapshotStore(store_dir)  # a restart
    assert store.recovered == [".tmp-snap-killed01"]
    assert store.list() == [] and os.listdir(store_dir) == []


def test_a_finished_write_survives_a_restart_whole(tmp_path: Path) -> None:
    upper = _upper(tmp_path / "upper", 4)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path / "s"), str(upper), "snap-whole001"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "committed", done.stderr
    store = SnapshotStore(tmp_path / "s")
    assert store.recovered == [] and [r.snapshot_id for r in store.list()] == ["snap-whole001"]
    assert sorted(os.listdir(store.layer_dir("snap-whole001"))) == sorted(os.listdir(upper))
