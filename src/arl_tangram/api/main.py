"""Shell: ``arl-tangram serve``: the runtime behind the HTTP API (native ``/v1`` and the
compatibility faces), in the foreground: the embedded one (``--backend local``), or one
controller over a node agent per Ray node (``--backend ray [--address ...]``).

The runtime is owned here, not by the app's lifespan, so that however uvicorn stops (one
SIGINT or SIGTERM: graceful; a second SIGINT: at once) the ``finally`` still closes it:
every unfinished action ends, every sandbox is destroyed. uvloop runs the event loop when
it is installed.
"""

from __future__ import annotations

import asyncio
import signal
import sys
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
    try:
        app = create_app(runtime)
        mount_compat(app)  # SandboxFusion, OpenAI-compatible and SWE-ReX faces beside /v1
        tokens = "a token is required" if tokens_from_config(config) else "no tokens: every call is tenant 'default'"
        await serve(app, host, port, log_level=log_level, on_listening=lambda url: _announce(url, tokens))
    finally:
        cpu = runtime.agent.cpu  # the Ray backend's sandboxes live on the nodes: counted there
        live = len(cpu.list_sandboxes()) if cpu is not None else 0
        await runtime.aclose()
        print(f"arl-tangram: stopped; {live} sandbox(es) destroyed", file=sys.stderr, flush=True)


def _note_signal(signum: int, _frame: object) -> None:
    print(f"arl-tangram: {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True)


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
    return 0
