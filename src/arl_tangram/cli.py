"""Shell: the ``arl-tangram`` command line.

- ``serve [--host 127.0.0.1] [--port 8080] [--config FILE]``: the HTTP service in the
  foreground; prints where it listens; SIGINT/SIGTERM stop it cleanly (every unfinished
  action ended, every sandbox destroyed).
- ``status``, ``env create|list|delete``, ``exec``, ``service register|list``: for people,
  against a running server over its HTTP API (``--url``, default ``$ARL_TANGRAM_URL`` or
  http://127.0.0.1:8080; ``--token``, default ``$ARL_TANGRAM_TOKEN``).
- ``image pull|import|list|rm|prefetch``: images, on this node's store (``--config``) or
  a server's (see ``cli_images``).
- ``sim``, ``bench``, ``version``.
Subcommands dispatch lazily so that ``arl-tangram sim ...`` never imports torch or the web
stack, and a missing optional dependency fails with a message naming the extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

BENCHES = ("scheduler", "cpu", "gpu", "overhead", "live", "ray", "service", "images", "fork", "verdicts", "memory")
SIMS = ("paper", "sweep")
SIM_MODULES = {"sweep": "arl_tangram.sim.sweep"}  # the rest: arl_tangram.sim.cli_<name>
CLIENT_COMMANDS = ("status", "env", "exec", "service", "image")
DEFAULT_URL = "http://127.0.0.1:8080"
INTERMIXED = ("env", "service", "image")  # an id may follow the options (`env delete --url U myenv`)
# `exec`'s exit status when the program did not run to its end (`timeout`'s and a shell's codes)
OUTCOME_EXIT_CODES = {"timed_out": 124, "oom_killed": 137, "rejected": 2, "cancelled": 130, "error": 1}
EXEC_EPILOG = """exit status: the program's own when it ran to its end (128+N when signal N ended it);
  124 timed out (--timeout), 137 killed for memory (OOM), 2 rejected (a demand no node can
  hold, a bad argument), 130 cancelled, 1 an error of the sandbox or the service."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arl-tangram", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("sim", help="run simulated experiments")
    sim.add_argument("experiment", choices=SIMS)
    bench = sub.add_parser("bench", help="run a live benchmark")
    bench.add_argument("target", choices=BENCHES)
    sub.add_parser("version", help="print the version")
    serve = sub.add_parser("serve", help="run the HTTP service in the foreground")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=int, default=8080, help="port (0: a free one, printed)")
    serve.add_argument("--config", default=None, help="configuration file (TOML, or YAML with PyYAML)")
    serve.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    serve.add_argument("--backend", default="local", choices=("local", "ray"), help="local: this machine; ray: an agent per Ray node")
    serve.add_argument("--address", default=None, help="with --backend ray: auto, host:port or ray://... (default: $RAY_ADDRESS, else a local Ray)")
    _add_client_commands(sub)
    return parser


def _add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    url = os.environ.get("ARL_TANGRAM_URL", DEFAULT_URL)
    common.add_argument("--url", default=url, help=f"the server (default: $ARL_TANGRAM_URL, else {DEFAULT_URL}; now {url})")
    common.add_argument("--token", default=os.environ.get("ARL_TANGRAM_TOKEN"), help="API token (or $ARL_TANGRAM_TOKEN)")
    common.add_argument("--json", action="store_true", help="print the server's JSON")
    sub.add_parser("status", parents=[common], help="pools, queue, sandboxes, services, providers of a server")
    env = sub.add_parser("env", parents=[common], help="create, list or delete environments")
    env.add_argument("action", choices=("create", "list", "delete"))
    env.add_argument("env_id", nargs="?", help="the env (delete; optional for create)")
    env.add_argument("--memory", default="1GiB", help="create: the env's memory limit (default: %(default)s)")
    env.add_argument("--image", default="host", help="host (the host's read-only root) or an image reference or id")
    ex = sub.add_parser(
        "exec", parents=[common], help="run a command in an env and print its output", epilog=EXEC_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    ex.add_argument("env_id")
    ex.add_argument("argv", nargs="+", help="the command (one string: run by bash -c)")
    ex.add_argument("--cpu", type=int, default=1, help="cores (DoP)")
    ex.add_argument("--timeout", type=float, default=60.0, help="timeout_s of the command")
    svc = sub.add_parser("service", parents=[common], help="register or list model services")
    svc.add_argument("action", choices=("register", "list"), help="register a service, or list the registered ones")
    svc.add_argument("name", nargs="?", help="register: the service's name, called as tg.call(NAME, ...) (e.g. reward/minilm)")
    svc.add_argument("--handler", choices=("embed", "score", "logprobs", "classify", "generate"), help="register: what a call computes")
    svc.add_argument("--folder", help="a model folder the server's [service] allowed_folders lists (or one inside it)")
    svc.add_argument("--module", help="a pkg.mod:factory the server's [service] allowed_modules lists")
    svc.add_argument("--builtin", choices=("minilm",), help="register: a model shipped with the package (minilm: name reward/minilm, handler score)")
    from arl_tangram.cli_images import add_parser

    add_parser(sub, common)


def _missing(command: str, exc: ModuleNotFoundError, extra: str) -> int:
    print(
        f"arl-tangram: {command} needs the optional dependency '{exc.name}'; install it with: pip install 'arl-tangram[{extra}]'",
        file=sys.stderr,
    )
    return 2


def _serve(args: argparse.Namespace) -> int:
    try:
        from arl_tangram.api.main import serve_forever
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("arl_tangram"):
            return _missing("serve", exc, "service,cpu")
        raise
    if args.address is not None and args.backend != "ray":
        print("arl-tangram: serve: --address needs --backend ray", file=sys.stderr)
        return 2
    return serve_forever(args.host, args.port, args.config, args.log_level, backend=args.backend, address=args.address)


# -- commands for people, over the HTTP API (httpx only) -----------------------------------
class _Progress:
    """A spinner with the elapsed seconds on stderr while a long request runs (a TTY only)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        started = time.monotonic()
        for frame in itertools.cycle("|/-\\"):
            if self.stop.wait(0.2):
                break
            sys.stderr.write(f"\r{frame} {self.what} ({time.monotonic() - started:.0f} s)")
            sys.stderr.flush()
        sys.stderr.write(f"\r{self.what}: done in {time.monotonic() - started:.1f} s\n")

    def __enter__(self) -> _Progress:
        if sys.stderr.isatty():
            self.thread.start()
        else:
            print(f"{self.what}...", file=sys.stderr)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


def _request(http: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    response = http.request(method, path, **kwargs)
    if response.status_code >= 400:
        try:
            body = response.json()
            message = body.get("error") or body
        except ValueError:
            message = response.text
        raise SystemExit(f"arl-tangram: {method} {path}: HTTP {response.status_code}: {message}")
    return response.json() if response.content else None


def _print_status(s: dict[str, Any]) -> None:
    print(f"tenant {s['tenant']}: {s['num_envs']} env(s), {s['num_pending_actions']} pending action(s) (bound {s['max_queued_actions']})")
    print("queue:     " + ", ".join(f"{lane} {n}" for lane, n in s["queue"].items()))
    for p in s["pools"]:
        print(f"pool:      {p['pool']:<14} {p['resource']:<15} used {p['used']}/{p['capacity']} ({100 * p['utilisation']:.0f}%), reserved {p['reserved']}")
    print("sandboxes: " + (", ".join(f"{k} {v}" for k, v in sorted(s["sandboxes"].items())) or "none"))
    print("services:  " + (", ".join(s["services"]) or "none"))
    print("providers: " + (", ".join(s["providers"]) or "none"))


def _exec(http: httpx.Client, args: argparse.Namespace) -> int:
    command: Any = args.argv[0] if len(args.argv) == 1 else list(args.argv)
    body = {"type": "exec", "env_id": args.env_id, "command": command, "cpu": {"min": args.cpu, "max": args.cpu}, "timeout_s": args.timeout}
    view = _request(http, "POST", "/v1/actions", json=body, params={"wait_s": 20})
    while view["state"] != "done":
        view = _request(http, "GET", f"/v1/actions/{view['action_id']}/wait", params={"timeout_s": 20})
    r = view["result"]
    if args.json:
        print(json.dumps(view, indent=2))
    else:
        sys.stdout.write(r["stdout"])
        sys.stderr.write(r["stderr"])
        if r["outcome"] != "succeeded":
            print(f"arl-tangram: {r['outcome']}" + (f" ({r['cause']})" if r["cause"] else ""), file=sys.stderr)
    return exec_exit_code(r["outcome"], r["exit_code"])


def _fill_builtin(args: argparse.Namespace) -> None:
    """``--builtin NAME``: the package's folder, and its name and handler unless given."""
    from arl_tangram.client.builtin import BUILTIN_MODELS, builtin_model

    try:
        args.folder = builtin_model(args.builtin)
    except ImportError as exc:
        raise SystemExit(f"arl-tangram: --builtin {args.builtin} needs the package {exc.name}: pip install 'arl-tangram[gpu]'") from None
    _package, name, handler = BUILTIN_MODELS[args.builtin]
    args.name, args.handler = args.name or name, args.handler or handler


def exec_exit_code(outcome: str, exit_code: int | None) -> int:
    """``exec``'s exit status (``EXEC_EPILOG``): never a negative code wrapped to 247."""
    if outcome in OUTCOME_EXIT_CODES:
        return OUTCOME_EXIT_CODES[outcome]
    if exit_code is None:
        return 1
    return 128 - exit_code if exit_code < 0 else exit_code  # -9: ended by SIGKILL -> 137


def _say_what_creation_waits_for(http: httpx.Client, memory: str) -> str:
    """The progress line of ``env create``: when no node has the memory free now, it says
    the creation waits for it (the server holds the request up to its create_timeout_s)."""
    from arl_tangram.runtime.config_reader import parse_size_bytes

    try:
        wanted = parse_size_bytes(memory, "--memory")
    except ValueError:
        return "creating the env"  # the server names the rule
    pools = [p for p in _request(http, "GET", "/v1/status")["pools"] if p["resource"] == "mem_bytes"]
    if not pools or wanted > max(p["capacity"] for p in pools) or any(p["capacity"] - p["reserved"] >= wanted for p in pools):
        return "creating the env"
    free = max(p["capacity"] - p["reserved"] for p in pools)
    return (
        f"waiting for {memory} of memory: no node has it free now (at most {free} bytes); the "
        "server holds the request until envs are released or its create_timeout_s passes (then: 503)"
    )


def run_client_command(args: argparse.Namespace) -> int:
    """``status``, ``env``, ``exec``, ``service``, ``image`` against the server at ``args.url``
    (``image --config``: this node's store instead)."""
    if args.command == "image" and args.config is not None:
        from arl_tangram.cli_images import run_local

        return run_local(args)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=httpx.Timeout(600.0, connect=5.0)) as http:
        try:
            return _client_command(http, args)
        except httpx.TransportError as exc:
            raise SystemExit(f"arl-tangram: cannot reach {args.url}: {exc} (is `arl-tangram serve` running?)") from None


def _client_command(http: httpx.Client, args: argparse.Namespace) -> int:
    out: Any
    if args.command == "status":
        out = _request(http, "GET", "/v1/status")
        if not args.json:
            _print_status(out)
            return 0
    elif args.command == "exec":
        return _exec(http, args)
    elif args.command == "image":
        from arl_tangram.cli_images import run_remote

        return run_remote(http, args, _request)
    elif args.command == "env" and args.action == "create":
        body = {"memory": args.memory, "image": args.image, **({"env_id": args.env_id} if args.env_id else {})}
        with _Progress(_say_what_creation_waits_for(http, args.memory)):
            out = _request(http, "POST", "/v1/envs", json=body)
        if not args.json:
            print(out["env_id"])
            return 0
    elif args.command == "env" and args.action == "list":
        out = _request(http, "GET", "/v1/envs")
        if not args.json:
            for e in out["envs"]:
                print(f"{e['env_id']}  {e['mem_bytes']} bytes  running {e['num_running']}")
            return 0
    elif args.command == "env":
        if not args.env_id:
            raise SystemExit("arl-tangram: env delete needs an env id")
        _request(http, "DELETE", f"/v1/envs/{args.env_id}")
        return 0
    elif args.action == "register":
        if args.builtin:
            _fill_builtin(args)
        if not args.name or not args.handler:
            raise SystemExit("arl-tangram: service register needs a name and --handler")
        body = {"name": args.name, "handler": args.handler, "folder": args.folder, "module": args.module}
        with _Progress(f"registering {args.name} (loading the model once)"):
            out = _request(http, "POST", "/v1/services", json=body)
    else:
        out = _request(http, "GET", "/v1/services")
        if not args.json:
            for svc in out["services"]:
                print(f"{svc['name']}  {svc['state']}  {'shared' if svc['shared'] else 'own'}  {svc['weight_bytes']} bytes")
            return 0
    print(json.dumps(out, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command; a reader that closes the pipe early (``status | head``) ends it quietly."""
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, not at exit: a closed pipe is caught below, not a traceback
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter's final flush must not raise again
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # SIGPIPE's status, as `yes | head` gives


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _main(argv: list[str]) -> int:
    parser = _build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in INTERMIXED and rest:  # positionals after options: parse them intermixed
        args = _subparser(parser, args.command).parse_intermixed_args(argv[argv.index(args.command) + 1 :], argparse.Namespace(command=args.command))
        rest = []
    if args.command == "version":
        from arl_tangram import __version__

        print(__version__)
        return 0
    if args.command == "serve":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _serve(args)
    if args.command in CLIENT_COMMANDS:
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return run_client_command(args)
    module_name = (
        SIM_MODULES.get(args.experiment, f"arl_tangram.sim.cli_{args.experiment}")
        if args.command == "sim"
        else f"arl_tangram.bench.{args.target}"
    )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("arl_tangram"):
            return _missing(args.command, exc, "gpu,cpu,plots")
        raise
    return int(module.main(rest))


if __name__ == "__main__":
    raise SystemExit(main())
