"""Watchers served by a run's pump thread (``run_watch``): a run with a memory grant starts no
thread of its own; the pump serves a watcher when its fd is readable and when its due time
comes; a watcher whose fd another thread replaced (even under the same number) is watched
anew; a v2 memory watch's inotify fd becomes readable when its file changes."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time

from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.memory_watch import ARMING_WORKERS, inotify_modified
from arl_tangram.managers.cpu.proc_io import pump
from arl_tangram.managers.cpu.run_watch import Waker
from tests.managers.cpu.conftest import needs_root

MIB = 1 << 20


@needs_root
def test_a_run_with_a_memory_grant_starts_no_thread_of_its_own(manager: CpuManager, sandbox: str) -> None:
    """Only the shared arming pool (v1 thresholds, ``memory_watch``) may add threads, and it
    is bounded whatever the number of runs."""
    manager.exec(sandbox, "true", mem_limit_bytes=64 * MIB, on_memory_paused=lambda _: None, timeout_s=10)  # warm
    out: dict[str, object] = {}
    before = {t.ident for t in threading.enumerate()}
    runner = threading.Thread(
        target=lambda: out.update(r=manager.exec(sandbox, "sleep 0.6; echo done", mem_limit_bytes=64 * MIB, on_memory_paused=lambda _: None, timeout_s=10))
    )  # fmt: skip
    runner.start()
    time.sleep(0.3)  # past the watch's first look: the old watch thread would be running now
    new = [t.name for t in threading.enumerate() if t.ident not in before and t is not runner]
    extra = [name for name in new if not name.startswith("memory-arming")]
    runner.join(20)
    assert out["r"].stdout_text == "done\n"  # type: ignore[attr-defined]
    assert extra == [], extra
    arming = [t for t in threading.enumerate() if t.name.startswith("memory-arming")]
    assert len(arming) <= ARMING_WORKERS


class Recorder:
    """A watcher as ``MemoryPause`` is one: a waker that other threads poke and a watch fd
    they may replace; records each serve's (time, which of its fds were ready)."""

    def __init__(self, due_after_s: float | None = None) -> None:
        self.waker, self.watch = Waker(), Waker()
        self.lock = threading.Lock()
        self.served: list[tuple[float, frozenset[str]]] = []
        self.due_after_s = due_after_s
        self.t0 = time.monotonic()

    def watched_fds(self) -> tuple[int, ...]:
        with self.lock:
            return (self.waker.fd, self.watch.fd)

    def serve(self, now: float, ready: frozenset[int]) -> float | None:
        with self.lock:
            names = frozenset(n for n, w in (("waker", self.waker), ("watch", self.watch)) if w.fd in ready)
            self.waker.drain()
            self.watch.drain()
            self.served.append((now - self.t0, names))
            return self.t0 + self.due_after_s if self.due_after_s is not None and len(self.served) == 1 else None

    def replace_watch(self) -> bool:
        """Close the watch fd, open another (the kernel reuses the lowest free number) and
        poke the waker, as a re-arm does; whether the number is the same."""
        with self.lock:
            old = self.watch.fd
            self.watch.close()
            self.watch = Waker()
            self.waker.poke()
            return self.watch.fd == old

    def close(self) -> None:
        self.waker.close()
        self.watch.close()


def _run(watcher: Recorder, seconds: float, *during: object) -> None:
    proc = subprocess.Popen(["sleep", str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for fn in during:
        threading.Thread(target=fn, daemon=True).start()
    pump(proc, stdin=None, timeout_s=10, cap_bytes=1024, cancel=None, on_stop=proc.kill, watchers=[watcher])
    watcher.close()


def _poke_watch_at(w: Recorder, at_s: float) -> object:
    def poke() -> None:
        time.sleep(at_s)
        with w.lock:
            w.watch.poke()

    return poke


def test_the_pump_serves_a_watcher_at_start_on_its_fd_and_at_its_due_time() -> None:
    w = Recorder(due_after_s=0.2)
    _run(w, 0.7, _poke_watch_at(w, 0.45))
    times = [(round(t, 2), sorted(n)) for t, n in w.served]
    assert w.served[0][0] < 0.1  # once at the start
    assert any(abs(t - 0.2) < 0.08 and not n for t, n in w.served), times  # its due time
    assert any("watch" in n and t >= 0.4 for t, n in w.served), times  # its fd
    assert len(w.served) == 3, times  # and nothing else: no polling


def test_a_watch_fd_replaced_by_another_thread_is_watched_anew() -> None:
    w = Recorder()
    reused: list[bool] = []

    def replace() -> None:
        time.sleep(0.15)
        reused.append(w.replace_watch())

    _run(w, 0.8, replace, _poke_watch_at(w, 0.4))
    times = [(round(t, 2), sorted(n)) for t, n in w.served]
    assert any("waker" in n for _, n in w.served), times  # the re-arm's poke
    assert any("watch" in n and t >= 0.35 for t, n in w.served), (times, reused)  # the new fd


def test_an_inotify_watch_is_readable_once_its_file_changes(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "memory.events")
    with open(path, "w") as f:
        f.write("high 0\n")
    fd = inotify_modified(path)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(0) == []
        with open(path, "a") as f:
            f.write("high 1\n")
        assert poller.poll(1000)
        os.read(fd, 4096)
        assert poller.poll(0) == []  # read: quiet until the next change
    finally:
        os.close(fd)
