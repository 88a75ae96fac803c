"""Bench: the HTTP service against hostile bodies (``arl-tangram bench service [--json]``).

- ``health_p50_ms_quiet`` / ``_p99_`` / ``_max_``: ``GET /v1/health`` round trips of one
  keep-alive client (about 200 a second) against ``arl-tangram serve`` in a subprocess.
- ``health_p99_ms_under_big_bodies`` (and ``_p50_``, ``_max_``): the same while another
  client (a process of its own) posts ``num_big_bodies`` JSON bodies of ``big_body_mb`` MB
  each, one after another, to ``POST /v1/actions`` under ``[service] max_body_bytes`` raised
  to 256 MiB: a service action whose request holds 100 strings of 1 MB (a batch to score),
  naming no service, so the server parses and validates it (off the loop: ``api.json_body``)
  and answers 404/422. ``big_body_s_mean``: one body's round trip.
- (the body bytes an unauthenticated upload gets read, by the app's own count, is asserted
  by ``tests/api/test_edge.py``: ``bench`` may not import ``api``; ``chunked_until_answered``
  here is the client both use.)
- with ``--fuzz-examples N``: ``fuzz_rc`` (0: no failure) and ``fuzz_examples`` of the
  schemathesis run of ``bench.service_fuzz`` (the suite runs it with 10).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from arl_tangram.bench.overhead_http import server_process

_SENDER = r"""
import http.client, json, sys, time
host, port, n, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"type": "service", "service": "bench/no-such-service",
                   "request": {"texts": ["x" * (1 << 20)] * mb}}).encode()
conn = http.client.HTTPConnection(host, port, timeout=600)
times = []
for _ in range(n):
    t = time.perf_counter()
    conn.request("POST", "/v1/actions", body=body, headers={"content-type": "application/json"})
    r = conn.getresponse(); r.read()
    times.append((time.perf_counter() - t, r.status))
print(json.dumps(times))
"""


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probe_health(url: str, until: Any, period_s: float = 0.005) -> list[float]:
    """Health round trips (ms) on one keep-alive connection while ``until()`` is false."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    samples: list[float] = []
    try:
        while not until():
            t = time.perf_counter()
            conn.request("GET", "/v1/health")
            conn.getresponse().read()
            samples.append((time.perf_counter() - t) * 1000)
            time.sleep(period_s)
    finally:
        conn.close()
    return samples


def big_bodies(num_bodies: int, body_mb: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"arl-tangram-{os.getpid()}-bench-") as tmp:
        config = os.path.join(tmp, "service.toml")
        with open(config, "w", encoding="utf-8") as f:
            f.write('[service]\nmax_body_bytes = "256MiB"\n')
        with server_process(extra_args=("--config", config)) as url:
            quiet_end = time.monotonic() + 3.0
            quiet = probe_health(url, lambda: time.monotonic() > quiet_end)
            parts = urlsplit(url)
            argv = [sys.executable, "-c", _SENDER, str(parts.hostname), str(parts.port), str(num_bodies), str(body_mb)]
            sender = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            try:
                loaded = probe_health(url, lambda: sender.poll() is not None)
                out, _ = sender.communicate(timeout=600)
            finally:
                if sender.poll() is None:
                    sender.kill()
                    sender.wait()
    times = json.loads(out)
    return {
        "health_p50_ms_quiet": round(statistics.median(quiet), 3), "health_p99_ms_quiet": round(_percentile(quiet, 0.99), 3),
        "health_max_ms_quiet": round(max(quiet), 3),
        "health_p50_ms_under_big_bodies": round(statistics.median(loaded), 3),
        "health_p99_ms_under_big_bodies": round(_percentile(loaded, 0.99), 3),
        "health_max_ms_under_big_bodies": round(max(loaded), 3), "num_health_samples_under_big_bodies": len(loaded),
        "num_big_bodies": num_bodies, "big_body_mb": body_mb,
        "big_body_s_mean": round(statistics.mean(t for t, _ in times), 3), "big_body_statuses": sorted({s for _, s in times}),
    }  # fmt: skip


def chunked_until_answered(url: str, path: str, headers: dict[str, str], total_bytes: int) -> tuple[int, int]:
    """Send a chunked body of up to ``total_bytes`` (64 KiB chunks) until the server answers;
    (status, bytes sent)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        sock.sendall((head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode())
        chunk = b"10000\r\n" + b"a" * 0x10000 + b"\r\n"
        sent = 0
        sock.setblocking(False)
        while True:
            readable, writable, _ = select.select([sock], [sock] if sent < total_bytes else [], [], 10)
            if readable:
                break
            if not writable:
                raise RuntimeError("no answer within 10 s")
            try:
                sent += max(0, sock.send(chunk) - 8)
            except BlockingIOError:
                continue
        sock.setblocking(True)
        return int(sock.recv(65536).decode("latin-1").split(" ", 2)[1]), sent
    finally:
        sock.close()


def fuzz(examples: int) -> dict[str, Any]:
    from arl_tangram.bench.service_fuzz import run_fuzz

    with tempfile.TemporaryDirectory(prefix=f"arl-tangram-{os.getpid()}-fuzz-") as tmp:
        config = os.path.join(tmp, "service.toml")
        with open(config, "w", encoding="utf-8") as f:
            f.write("[service]\nmax_queued_actions = 64\n")
        with server_process(extra_args=("--config", config)) as url:
            result = run_fuzz(url, max_examples=examples, timeout_s=3600)
    if result.rc != 0:
        print(result.summary, file=sys.stderr)
    return {"fuzz_rc": result.rc, "fuzz_examples": examples}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench service", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--bodies", type=int, default=10, help="big bodies to send (default 10)")
    parser.add_argument("--body-mb", type=int, default=100, help="MB per big body (default 100)")
    parser.add_argument("--fuzz-examples", type=int, default=0, help="also fuzz the schema with N examples per route")
    args = parser.parse_args(argv)
    print("bench service: measuring...", file=sys.stderr)
    result = big_bodies(args.bodies, args.body_mb)
    if args.fuzz_examples > 0:
        result.update(fuzz(args.fuzz_examples))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40s} {value}")
    return 0
