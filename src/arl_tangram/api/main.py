"""Shell: ``arl-tangram serve``: the runtime behind the HTTP API (native ``/v1`` and the
compatibility faces), in the foreground: the embedded one (``--backend local``), or one
controller over a node agent per Ray node (``--backend ray [--address ...]``).

The runtime is owned here, not by the app's lifespan, so that however uvicorn stops (one
SIGINT or SIGTERM: graceful; a second SIGINT: at once) the ``finally`` still closes it:
every unfinished action ends, every sandbox is destroyed. uvloop runs the event loop when
it is installed.

A stop is bounded by ``[service] shutdown_grace_s`` (default 10 s) from its first moment:
then pending env creations and queued actions end ``error`` / ``shutting_down`` and running
ones are stopped (``Controller.begin_shutdown``), uvicorn's graceful wait is at most a
third of the grace, and a ``StopDeadline`` thread ends the process if the stop is still
not done just before the grace runs out (the journal flushed first; the CPU manager's
keeper removes any sandbox left, as after ``kill -9``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from arl_tangram.api.app import create_app
from arl_tangram.api.auth import tokens_from_config
from arl_tangram.api.compat import mount_compat
from arl_tangram.api.server import serve
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import TangramConfig, load_config
from arl_tangram.runtime.embedded import EmbeddedRuntime


async def _start(config: TangramConfig, backend: str, address: str | None) -> Any:
    if backend == "ray":
        from arl_tangram.runtime.ray import start_ray_runtime

        return await start_ray_runtime(config, address)
    return await EmbeddedRuntime.start(config)


async def _main(host: str, port: int, config_path: str | None, log_level: str, backend: str, address: str | None) -> None:
    config = load_config(config_path)
    # uvicorn catches SIGINT/SIGTERM while it serves, then re-raises them to the handlers it
    # found: with the default ones the process would die before the runtime is closed.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _note_signal)
    runtime = await _start(config, backend, address)
    grace_s = config.service.shutdown_grace_s
    deadline = StopDeadline(grace_s, lambda: _flush_journal(runtime))
    _DEADLINES[:] = [deadline]

    def on_stopping() -> None:
        deadline.arm()
        runtime.controller.begin_shutdown()

    try:
        app = create_app(runtime)
        mount_compat(app, config=runtime.config)  # SandboxFusion, OpenAI-compatible, SWE-ReX and E2B faces beside /v1
        tokens = "a token is required" if tokens_from_config(config) else "no tokens: every call is tenant 'default'"
        await serve(
            app, host, port, log_level=log_level, on_listening=lambda url: _announce(url, tokens),
            on_stopping=on_stopping, graceful_s=grace_s / 3,
        )  # fmt: skip
    finally:
        cpu = runtime.agent.cpu  # the Ray backend's sandboxes live on the nodes: counted there
        live = len(cpu.list_sandboxes()) if cpu is not None else 0
        await runtime.aclose()
        print(f"arl-tangram: stopped; {live} sandbox(es) destroyed", file=sys.stderr, flush=True)


def _note_signal(signum: int, _frame: object) -> None:
    print(f"arl-tangram: {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)
    for deadline in _DEADLINES:  # a signal uvicorn did not see (before it served, or after)
        deadline.arm()


class StopDeadline:
    """Ends the process if a stop outlives its grace: ``arm`` (idempotent) at the stop's
    first moment starts a daemon timer; it fires a little before ``grace_s`` (so that the
    exit itself fits), runs ``before_exit`` (bounded: the journal's flush) and exits with
    ``EXIT_STOP_OVERDUE``. A stop that finishes in time never sees it fire: the process
    ends first and the daemon thread with it."""

    def __init__(self, grace_s: float, before_exit: Callable[[], None]) -> None:
        self.grace_s = grace_s
        self.before_exit = before_exit
        self.fire_after_s = max(grace_s * 0.5, grace_s - 1.0)
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.fire_after_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        print(f"arl-tangram: the stop outlived shutdown_grace_s={self.grace_s:g}; exiting now", file=sys.stderr, flush=True)
        try:
            self.before_exit()
        finally:
            os._exit(EXIT_STOP_OVERDUE)


EXIT_STOP_OVERDUE = 3
JOURNAL_FLUSH_S = 0.5
_DEADLINES: list[StopDeadline] = []  # the running server's, for the signal handler


def _flush_journal(runtime: Any) -> None:
    """From the deadline's thread: the journal's writer commits what is queued (its queue is
    thread-safe), within ``JOURNAL_FLUSH_S``."""
    journal = getattr(runtime.controller, "journal", None)
    if journal is not None:
        try:
            journal.flush().result(JOURNAL_FLUSH_S)
        except Exception as exc:  # closed meanwhile, or too slow: the exit goes on
            print(f"arl-tangram: journal flush at the deadline: {exc!r}", file=sys.stderr, flush=True)


def _announce(url: str, tokens: str) -> None:
    # stdout, one line, flushed: scripts (the HTTP bench) read the URL from it
    print(f"arl-tangram: listening on {url} ({tokens})", flush=True)


def serve_forever(
    host: str, port: int, config_path: str | None, log_level: str = "warning", *, backend: str = "local", address: str | None = None
) -> int:
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(_main(host, port, config_path, log_level, backend, address))
    except SpecError as exc:  # a ConfigError names the field path and the rule
        print(f"arl-tangram: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    # Everything is closed (sandboxes destroyed, journal committed): the interpreter's final
    # collection of this heap took 3-4 s of a stop on a busy host; frozen objects skip it.
    gc.freeze()
    return 0
