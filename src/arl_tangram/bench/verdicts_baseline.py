"""Shell: the baseline of ``bench verdicts``: a SandboxFusion-style server that starts every
run at once, each a plain process in its own cgroup limited to 1 core (CFS quota) on all
of the node's cpus, with a wall-clock ``run_timeout`` (as SandboxFusion's lite isolation
runs code: no queue, the kernel shares the cores). Python programs only; it answers
``POST /run_code`` with the fields verl's client reads.

Stdlib HTTP (``ThreadingHTTPServer``) on 127.0.0.1: a thread per request, as many runs at
once as requests. Cleans up its cgroups and processes on ``close``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from arl_tangram.managers.cpu.cgroup_detect import detect_driver
from arl_tangram.managers.cpu.cgroup_driver import INIT_SLOT
from arl_tangram.managers.cpu.grants import quota_us
from arl_tangram.managers.cpu.topology import read_topology

MEM_BYTES = 512 << 20
PIDS_MAX = 256


class LiteRunner:
    """Runs one program per call in a fresh 1-core cgroup; thread-safe."""

    def __init__(self) -> None:
        self.driver = detect_driver(f"arl-tangram-verdicts-base-{os.getpid()}")
        self.driver.create_root()
        self.cpus = read_topology().cpus
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._in_flight = 0

    def run(self, code: str, stdin: str | None, timeout_s: float) -> dict[str, Any]:
        with self._lock:
            name = f"r{next(self._ids)}"
            self._in_flight += 1
        try:
            return self._run(name, code, stdin, timeout_s)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._lock.notify_all()

    def _run(self, name: str, code: str, stdin: str | None, timeout_s: float) -> dict[str, Any]:
        self.driver.create_sandbox(name, MEM_BYTES, PIDS_MAX, self.cpus)
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(code)
        try:
            self.driver.set_grant(name, None, quota_us(1000))  # 1 core, as a lite run's limit
            joins = " ".join(f"echo $$ > {p};" for p in self.driver.join_files(name, INIT_SLOT))
            argv = ["sh", "-c", f"{joins} exec {sys.executable} -I {f.name}"]
            started = time.monotonic()
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, err = proc.communicate((stdin or "").encode(), timeout=timeout_s)
                status, code_rc = "Finished", proc.returncode
            except subprocess.TimeoutExpired:
                proc.kill()  # the program itself (sh exec'd it), then anything it started
                self.driver.kill_sandbox(name, spare_host=False)
                out, err = proc.communicate(timeout=30)
                status, code_rc = "TimeLimitExceeded", None
            elapsed = time.monotonic() - started
        finally:
            os.unlink(f.name)
            self.driver.kill_sandbox(name, spare_host=False)
            self.driver.remove_sandbox(name)
        ok = status == "Finished" and code_rc == 0
        run = {"status": status, "execution_time": elapsed, "return_code": code_rc, "stdout": out.decode(errors="replace"),
               "stderr": err.decode(errors="replace")}  # fmt: skip
        return {"status": "Success" if ok else "Failed", "message": "", "compile_result": None, "run_result": run,
                "executor_pod_name": None, "files": {}}  # fmt: skip

    def close(self, wait_s: float = 120.0) -> None:
        """Wait for runs in flight (a client that gave up leaves its run going), then
        remove the root group."""
        with self._lock:
            self._lock.wait_for(lambda: self._in_flight == 0, wait_s)
        self.driver.remove_root()


def _handler(runner: LiteRunner) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            answer = json.dumps(runner.run(body["code"], body.get("stdin"), float(body.get("run_timeout", 10)))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
            return None

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # every call at once: none may wait in the listen backlog
    daemon_threads = True


@contextlib.contextmanager
def baseline_server() -> Iterator[str]:
    """The baseline served on a free loopback port; yields its ``/run_code`` URL."""
    runner = LiteRunner()
    httpd = _Server(("127.0.0.1", 0), _handler(runner))
    thread = threading.Thread(target=httpd.serve_forever, name="verdicts-baseline", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/run_code"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
        runner.close()
