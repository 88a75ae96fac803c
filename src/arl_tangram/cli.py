"""Shell: the ``arl-tangram`` command line.

Subcommands dispatch lazily so that ``arl-tangram sim ...`` never imports torch, and a
missing optional dependency fails with a message naming the extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

BENCHES = ("scheduler", "cpu", "gpu", "overhead", "live")
SIMS = ("paper", "sweep")
SIM_MODULES = {"sweep": "arl_tangram.sim.sweep"}  # the rest: arl_tangram.sim.cli_<name>


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arl-tangram", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("sim", help="run simulated experiments")
    sim.add_argument("experiment", choices=SIMS)
    bench = sub.add_parser("bench", help="run a live benchmark")
    bench.add_argument("target", choices=BENCHES)
    sub.add_parser("version", help="print the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "version":
        from arl_tangram import __version__

        print(__version__)
        return 0
    module_name = (
        SIM_MODULES.get(args.experiment, f"arl_tangram.sim.cli_{args.experiment}")
        if args.command == "sim"
        else f"arl_tangram.bench.{args.target}"
    )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("arl_tangram"):
            print(
                f"arl-tangram: {args.command} needs the optional dependency '{exc.name}'; "
                "install it with: pip install 'arl-tangram[gpu,cpu,plots]'",
                file=sys.stderr,
            )
            return 2
        raise
    return int(module.main(rest))


if __name__ == "__main__":
    raise SystemExit(main())
