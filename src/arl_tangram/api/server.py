"""Shell: running the app under uvicorn: ``serve`` (the CLI's foreground server) and
``ServerThread`` (a server on a free loopback port in a background thread: tests, embedding).

uvicorn runs with uvloop and httptools when they are installed (its ``auto`` choice), no
access log (it would cost more than a no-resource action), and a bounded graceful shutdown
so long polls cannot hold a stop forever (``graceful_s``: at most ``GRACEFUL_SHUTDOWN_S``).
The socket is bound before uvicorn starts, so ``port=0`` gives a free port that is known
before the first request. Once told to stop, the app's long polls are told first and then
``on_stopping`` runs (``serve``: the owner ends what is pending and arms its deadline).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

GRACEFUL_SHUTDOWN_S = 3


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(app: Any, *, log_level: str = "warning", graceful_s: float = GRACEFUL_SHUTDOWN_S) -> uvicorn.Server:
    config = uvicorn.Config(
        app, loop="auto", http="auto", lifespan="on", access_log=False, log_level=log_level,
        timeout_graceful_shutdown=max(1, int(min(graceful_s, GRACEFUL_SHUTDOWN_S))), backlog=2048,
    )  # fmt: skip
    return uvicorn.Server(config)


async def serve(
    app: Any, host: str, port: int, *, on_listening: Callable[[str], None] | None = None, log_level: str = "warning",
    on_stopping: Callable[[], None] | None = None, graceful_s: float = GRACEFUL_SHUTDOWN_S,
) -> None:  # fmt: skip
    """Serve until SIGINT/SIGTERM (uvicorn's handlers, main thread) or ``should_exit``."""
    sock = bind(host, port)
    try:
        await serve_on(make_server(app, log_level=log_level, graceful_s=graceful_s), sock, on_listening, on_stopping)
    finally:
        sock.close()


async def serve_on(
    server: uvicorn.Server, sock: socket.socket, on_listening: Callable[[str], None] | None = None,
    on_stopping: Callable[[], None] | None = None,
) -> None:  # fmt: skip
    """Run ``server`` on ``sock``; once it is told to stop, the app's long polls are told
    first (``ApiState.begin_stopping``), then ``on_stopping`` runs, so the graceful
    shutdown is not spent waiting."""

    async def watch() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.01)
        if server.started and on_listening is not None:
            name = sock.getsockname()
            shown = f"[{name[0]}]" if ":" in name[0] else name[0]
            on_listening(f"http://{shown}:{name[1]}")
        while not server.should_exit:
            await asyncio.sleep(0.05)
        api = getattr(server.config.app.state, "api", None) if hasattr(server.config.app, "state") else None
        if api is not None:
            api.begin_stopping()
        if on_stopping is not None:
            on_stopping()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(watch())
        await server.serve(sockets=[sock])
        server.should_exit = True  # ends ``watch`` if the startup failed


class ServerThread:
    """``with ServerThread(app) as s: s.url`` - the app served on ``127.0.0.1:<free port>`` in
    a thread with its own event loop; leaving stops it and runs the app's shutdown."""

    def __init__(self, app: Any, host: str = "127.0.0.1", *, start_timeout_s: float = 60.0) -> None:
        self.app = app
        self.sock = bind(host, 0)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = make_server(app)
        self.thread = threading.Thread(target=self._run, name="tangram-test-server", daemon=True)
        self.start_timeout_s = start_timeout_s
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=self.server.config.get_loop_factory()) as runner:
                runner.run(serve_on(self.server, self.sock))
        except BaseException as exc:  # reported by start()/stop() in the caller's thread
            self.error = exc

    def start(self) -> ServerThread:
        self.thread.start()
        waited = 0.0
        while not self.server.started:
            if not self.thread.is_alive() or waited > self.start_timeout_s:
                self.stop()
                raise RuntimeError(f"the server did not start: {self.error!r}")
            self.thread.join(0.01)
            waited += 0.01
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(GRACEFUL_SHUTDOWN_S + 60)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
