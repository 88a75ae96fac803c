"""A real local API provider for tests: stdlib ``ThreadingHTTPServer`` on 127.0.0.1 with an
ephemeral port, enforcing its own per-key rate limit (token bucket of ``burst`` requests
refilled at ``rps``) with 429 + Retry-After, optionally a per-key tokens/min limit, and
answering OpenAI-shaped JSON with ``usage``.

Reusable by any test::

    with serve_provider(rps=5, keys=("k1", "k2")) as base_url:
        ...  # base_url is a str ("http://127.0.0.1:PORT") and the server's handle:
        base_url.stats("k1").accepted, base_url.set_mode("down"), base_url.total_429s()

Modes: ``up``; ``down`` (the socket is closed: connection refused, same port on ``up``);
``hang`` (accepts and never answers until stopped); ``503`` (every request answered 503).
A request body ``{"tokens": N}`` overrides ``tokens_per_request``; ``{"delay_s": S}`` the delay.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class KeyStats:
    accepted: int = 0
    rejected_429: int = 0
    tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    accept_times: list[float] = field(default_factory=list)  # time.monotonic() of each accept
    token_times: list[tuple[float, int]] = field(default_factory=list)


class _Bucket:
    def __init__(self, capacity: float, refill_per_s: float) -> None:
        self.capacity, self.refill_per_s = capacity, refill_per_s
        self.level, self.at = capacity, time.monotonic()

    def wait_s(self, amount: float) -> float:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.at) * self.refill_per_s)
        self.at = now
        return 0.0 if self.level >= amount - 1e-9 else (amount - self.level) / self.refill_per_s


class ProviderServer(str):
    """The base URL, carrying the running server's controls and per-key statistics."""

    _server: ThreadingHTTPServer | None
    _thread: threading.Thread | None

    def __new__(cls, port: int, **settings: Any) -> ProviderServer:
        return super().__new__(cls, f"http://127.0.0.1:{port}")

    def __init__(self, port: int, **settings: Any) -> None:
        self.port = port
        self.rps: float = settings["rps"]
        self.burst: float = settings["burst"]
        self.tokens_per_min: int | None = settings["tokens_per_min"]
        self.tokens_per_request: int = settings["tokens_per_request"]
        self.delay_s: float = settings["delay_s"]
        self.retry_after: str = settings["retry_after"]
        self.auth_header: str = settings["auth_header"]
        self.auth_scheme: str = settings["auth_scheme"]
        self.mode = "up"
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._keys = {key: KeyStats() for key in settings["keys"]}
        self._rate = {key: _Bucket(self.burst, self.rps) for key in self._keys}
        self._tokens = {
            key: _Bucket(self.tokens_per_min, self.tokens_per_min / 60.0)
            for key in self._keys
            if self.tokens_per_min is not None
        }
        self.unauthorized = 0
        self._server = None
        self._thread = None

    @property
    def base_url(self) -> str:
        return str(self)

    def stats(self, key: str) -> KeyStats:
        return self._keys[key]

    def total_429s(self) -> int:
        return sum(s.rejected_429 for s in self._keys.values())

    def total_accepted(self) -> int:
        return sum(s.accepted for s in self._keys.values())

    def set_mode(self, mode: str) -> None:
        assert mode in ("up", "down", "hang", "503"), mode
        if mode == "down" and self._server is not None:
            self._stop_server()
        elif mode != "down" and self._server is None:
            self._start_server()
        self.mode = mode

    def _start_server(self, server: ThreadingHTTPServer | None = None) -> None:
        self.stopping.clear()
        server = server or ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        server.daemon_threads = True
        server.provider = self  # type: ignore[attr-defined]
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def _stop_server(self) -> None:
        assert self._server is not None and self._thread is not None
        self.stopping.set()  # ends hanging handlers
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server, self._thread = None, None

    def admit(self, key: str | None, tokens: int) -> tuple[int, dict[str, str], float]:
        """The server's decision for one request: (status, extra headers, wait_s)."""
        with self.lock:
            if key not in self._keys:
                self.unauthorized += 1
                return 401, {}, 0.0
            assert key is not None
            wait_s = self._rate[key].wait_s(1)
            if wait_s == 0.0 and key in self._tokens:
                wait_s = self._tokens[key].wait_s(tokens)
            stats = self._keys[key]
            if wait_s > 0:
                stats.rejected_429 += 1
                return 429, self._retry_after_header(wait_s), wait_s
            self._rate[key].level -= 1
            if key in self._tokens:
                self._tokens[key].level -= tokens
            now = time.monotonic()
            stats.accepted += 1
            stats.tokens += tokens
            stats.accept_times.append(now)
            stats.token_times.append((now, tokens))
            stats.in_flight += 1
            stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
            return 200, {}, 0.0

    def finish(self, key: str) -> None:
        with self.lock:
            self._keys[key].in_flight -= 1

    def _retry_after_header(self, wait_s: float) -> dict[str, str]:
        if self.retry_after == "seconds":
            return {"Retry-After": f"{math.ceil(wait_s * 1000) / 1000:.3f}"}  # rounded up: never early
        if self.retry_after == "int":
            return {"Retry-After": str(math.ceil(wait_s))}
        if self.retry_after == "date":
            return {"Retry-After": formatdate(time.time() + wait_s, usegmt=True)}
        return {}

    def key_of(self, headers: Any) -> str | None:
        value = headers.get(self.auth_header)
        if value is None:
            return None
        prefix = f"{self.auth_scheme} " if self.auth_scheme else ""
        return value[len(prefix):] if value.startswith(prefix) else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real providers

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        provider: ProviderServer = self.server.provider  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {}
        payload = payload if isinstance(payload, dict) else {}
        if provider.mode == "hang":
            provider.stopping.wait(30)
            return
        if provider.mode == "503":
            self._reply(503, {"error": "overloaded"}, {})
            return
        tokens = int(payload.get("tokens", provider.tokens_per_request))
        key = provider.key_of(self.headers)
        status, headers, _ = provider.admit(key, tokens)
        if status != 200:
            self._reply(status, {"error": {"code": status}}, headers)
            return
        assert key is not None
        try:
            delay_s = float(payload.get("delay_s", provider.delay_s))
            if delay_s > 0:
                provider.stopping.wait(delay_s)
            body = {
                "object": "chat.completion",
                "path": self.path,
                "echo": payload,
                "usage": {"prompt_tokens": tokens // 2, "completion_tokens": tokens - tokens // 2, "total_tokens": tokens},
            }
        finally:
            provider.finish(key)
        self._reply(200, body, {})

    def _reply(self, status: int, body: Any, headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client went away (a cancelled call)


@contextmanager
def serve_provider(
    rps: float = 10.0,
    *,
    burst: float = 2.0,
    keys: tuple[str, ...] = ("test-key-0",),
    tokens_per_min: int | None = None,
    tokens_per_request: int = 100,
    delay_s: float = 0.0,
    retry_after: str = "seconds",
    auth_header: str = "Authorization",
    auth_scheme: str = "Bearer",
) -> Iterator[ProviderServer]:
    """Run a provider on 127.0.0.1 (ephemeral port) for the ``with`` block; limits per key.
    ``retry_after``: ``seconds`` (fractional), ``int`` (whole seconds), ``date`` or ``none``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)  # bound first: the URL needs the port
    handle = ProviderServer(
        httpd.server_address[1], rps=rps, burst=burst, keys=keys, tokens_per_min=tokens_per_min,
        tokens_per_request=tokens_per_request, delay_s=delay_s, retry_after=retry_after,
        auth_header=auth_header, auth_scheme=auth_scheme,
    )
    handle._start_server(httpd)
    try:
        yield handle
    finally:
        if handle._server is not None:
            handle._stop_server()
