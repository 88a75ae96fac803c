"""Bench: what the HTTP service costs a no-resource action (``arl-tangram bench overhead``'s HTTP keys).

The server is a real ``arl-tangram serve --port 0`` subprocess (uvicorn, uvloop and
httptools when installed, the embedded runtime); the load generator runs in this process
on the same machine, so its cost is part of every figure.

- ``http_submit_to_start_p50_ms`` / ``_p99_ms``: one ``noop`` at a time, from just before
  the client sends ``POST /v1/actions?wait_s=...`` to the action's start as the server
  reports it (``started_at``, Unix seconds; both processes read the same clock).
- ``http_noop_actions_per_s``: submit-and-wait round trips completed per second by 32
  concurrent clients, each on its own keep-alive connection, one action per request, no
  batch endpoint. The load generator is a minimal HTTP/1.1 client on asyncio streams:
  what the figure measures is the server, not a client library's per-request cost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

NOOP_BODY = b'{"type":"noop"}'
_URL = re.compile(r"listening on (http://[^\s]+)")
STDERR_TAIL = 200  # lines of the server's stderr kept for an early exit's error


@contextlib.contextmanager
def server_process(start_timeout_s: float = 60.0, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """``arl-tangram serve --port 0 [extra_args]`` in a subprocess; yields its URL, SIGTERM on exit.

    Its stdout and stderr are read to the end on threads of their own: a pipe nobody reads
    fills (64 KiB) and then blocks the server's next log line, and with it its event loop,
    in the middle of the load being measured. The last ``STDERR_TAIL`` lines of stderr are
    kept for the error when the server exits early."""
    argv = [sys.executable, "-m", "arl_tangram.cli", "serve", "--host", "127.0.0.1", "--port", "0", *extra_args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
    readers = [threading.Thread(target=tail.extend, args=(proc.stderr,), daemon=True)]
    try:
        readers[0].start()
        deadline = time.monotonic() + start_timeout_s
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                readers[0].join(5.0)
                raise RuntimeError(f"the server exited: {''.join(tail)}")
            if m := _URL.search(line):
                url = m.group(1)
        if url is None:
            raise RuntimeError("the server did not say where it listens in time")
        readers.append(threading.Thread(target=_drain, args=(proc.stdout,), daemon=True))
        readers[1].start()
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(5.0)


def _drain(stream: Any) -> None:
    """Read ``stream`` to its end, dropping what it says."""
    for _line in stream:
        pass


class RawConnection:
    """One keep-alive HTTP/1.1 connection: POST a body, read the JSON answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, f"{host}:{port}")

    async def post(self, path: str, body: bytes) -> dict[str, Any]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(headers[9:12])
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", headers).group(1))  # type: ignore[union-attr]
        answer = json.loads(await self.reader.readexactly(length))
        if status != 201:
            raise RuntimeError(f"HTTP {status}: {answer}")
        return dict(answer)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def submit_to_start_ms(url: str, n: int) -> list[float]:
    conn = await RawConnection.open(url)
    samples: list[float] = []
    try:
        for _ in range(n):
            sent = time.time()
            view = await conn.post("/v1/actions?wait_s=5", NOOP_BODY)
            assert view["result"]["outcome"] == "succeeded", view
            samples.append((view["started_at"] - sent) * 1000.0)
    finally:
        await conn.close()
    return samples


async def noop_throughput(url: str, clients: int, duration_s: float) -> tuple[float, int]:
    """(actions per second, actions completed) by ``clients`` concurrent connections."""
    conns = [await RawConnection.open(url) for _ in range(clients)]
    done = 0
    deadline = time.monotonic() + duration_s

    async def client(conn: RawConnection) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            view = await conn.post("/v1/actions?wait_s=5", NOOP_BODY)
            assert view["result"]["outcome"] == "succeeded", view
            done += 1

    try:
        started = time.monotonic()
        await asyncio.gather(*(client(c) for c in conns))
        elapsed = time.monotonic() - started
    finally:
        for c in conns:
            await c.close()
    return done / elapsed, done


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def measure_http(quick: bool) -> dict[str, Any]:
    """The HTTP keys of ``bench overhead``, against a server started for the measurement."""
    with server_process() as url:
        _run(submit_to_start_ms(url, 50))  # warm up: imports, first rounds, connection setup
        starts = _run(submit_to_start_ms(url, 200 if quick else 1000))
        load_before = os.getloadavg()[0]
        per_s, n = _run(noop_throughput(url, 32, 1.0 if quick else 5.0))
    return {
        "http_submit_to_start_p50_ms": round(statistics.median(starts), 3),
        "http_submit_to_start_p99_ms": round(sorted(starts)[min(len(starts) - 1, round(0.99 * (len(starts) - 1)))], 3),
        "http_noop_actions_per_s": round(per_s, 1),
        "http_samples": {"submit_to_start": len(starts), "noop_round_trips": n, "clients": 32},
        "http_load_average_1m_before_throughput": round(load_before, 2),
    }
