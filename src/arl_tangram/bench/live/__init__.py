"""Shell: ``arl-tangram bench live [--json] [--quick] [--report-dir DIR]``, real agentic-RL
rollouts on this machine, ARL-Tangram side by side with the allocation schemes users run
today, on the same cores in one run, and the simulator checked against the live figures.

Runs the workloads in turn (``swe``, ``coding``, ``mopd``, ``deepsearch``: each module's
``run(opts, progress) -> WorkloadResult``), then ``simcheck.run``; progress goes to stderr
while it runs. Prints the side-by-side table (to stdout, or to stderr under ``--json``,
which prints exactly one JSON object on stdout), and writes PNG plots into ``--report-dir``
(in a forked process while the simulator check runs: both come after every measurement, so
overlapping them changes no figure). ``wall_s`` is the whole run, plots included;
``wall_s_by_phase`` says where it went (each workload, then the check and the plots).
A workload whose module is missing is reported "not run"; one that fails is reported with
its error, the others still run, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import math
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arl_tangram.bench.live.common import LiveOptions, Progress, WorkloadResult
from arl_tangram.bench.live.report import WORKLOADS, json_object, render, write_plots
from arl_tangram.core.policies.elastic import DEFAULT_SHORT_FIRST_SLOWDOWN


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="arl-tangram bench live", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout (the table goes to stderr)")
    parser.add_argument("--quick", action="store_true", help="smaller workloads (make demo, CI; swe halves T and leaves the dominated k8s-guaranteed-fit to the full run)")
    parser.add_argument("--report-dir", type=Path, default=None, help="write PNG plots here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="run only these workloads (repeatable)")
    parser.add_argument("--preempt-quantum-s", type=float, default=None, help="coding: tangram with preemption at this quantum (issue 26)")
    parser.add_argument("--short-first-slowdown", type=float, default=DEFAULT_SHORT_FIRST_SLOWDOWN,
                        help="swe and coding: tangram's CPU queue order (0: FCFS; default: the elastic policy's)")  # fmt: skip
    parser.add_argument("--no-cpu-packing", action="store_true", help="coding: tangram without CPU packing (the side-by-side; issue 26)")
    parser.add_argument(
        "--judge", choices=("minilm", "generative"), default="minilm",
        help="DeepSearch's judge: MiniLM scoring (default) or a generated causal LM asked for a verdict",
    )  # fmt: skip
    return parser.parse_args(list(argv))


def _run_workload(name: str, opts: LiveOptions, progress: Progress) -> tuple[WorkloadResult | None, str | None]:
    """(result, None), or (None, why it did not run): a missing module or the error it raised."""
    try:
        module = importlib.import_module(f"arl_tangram.bench.live.{name}")
    except ImportError as exc:
        return None, f"module unavailable ({type(exc).__name__}: {exc})"
    try:
        result = module.run(opts, progress)
    except Exception as exc:  # noqa: BLE001 - one workload's failure must not hide the others
        traceback.print_exc(file=sys.stderr)
        return None, f"failed: {type(exc).__name__}: {exc}"
    return result, None


def _simcheck(results: list[WorkloadResult], opts: LiveOptions) -> tuple[dict[str, dict[str, float]], str | None]:
    try:
        module = importlib.import_module("arl_tangram.bench.live.simcheck")
    except ImportError as exc:
        return {}, f"simcheck unavailable ({type(exc).__name__}: {exc})"
    try:
        return module.run(results, opts), None
    except Exception as exc:  # noqa: BLE001 - the live figures stand without the check
        traceback.print_exc(file=sys.stderr)
        return {}, f"simcheck failed: {type(exc).__name__}: {exc}"


def _jsonable(value: Any) -> Any:
    """nan and inf become null: the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _plots(plotting: concurrent.futures.Future[list[Path]] | None, results: list[WorkloadResult], report_dir: Path | None) -> list[str]:
    """The plot files the forked writer wrote; if it failed, they are written here instead."""
    if plotting is None or report_dir is None:
        return []
    try:
        return [str(p) for p in plotting.result()]
    except Exception:  # noqa: BLE001 - a broken worker must not cost the report its plots
        traceback.print_exc(file=sys.stderr)
        return [str(p) for p in write_plots(results, report_dir)]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    opts = LiveOptions(quick=args.quick, report_dir=args.report_dir, seed=args.seed, judge=args.judge, preempt_quantum_s=args.preempt_quantum_s,
                       short_first_slowdown=args.short_first_slowdown, cpu_packing=not args.no_cpu_packing)  # fmt: skip
    progress = Progress()
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    results: list[WorkloadResult] = []
    not_run: dict[str, str] = {}
    phases_s: dict[str, float] = {}
    for name in args.only or WORKLOADS:
        begun = time.monotonic()
        result, why = _run_workload(name, opts, progress)
        phases_s[name] = round(time.monotonic() - begun, 2)
        if result is not None:
            results.append(result)
        else:
            not_run[name] = str(why)
            progress.note(name, f"not run: {why}")
    begun = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        plotting = pool.submit(write_plots, results, opts.report_dir) if opts.report_dir is not None and results else None
        simcheck, sim_problem = _simcheck(results, opts) if results else ({}, None)
        plots = _plots(plotting, results, opts.report_dir)
    phases_s["simcheck_and_plots"] = round(time.monotonic() - begun, 2)
    for result in results:  # the per-workload key beside the map (swe.sim_vs_live_act_ratio)
        if result.name == "swe" and "swe" in simcheck:
            result.summary["sim_vs_live_act_ratio"] = simcheck["swe"]["ratio"]
    wall_s = time.monotonic() - started
    host: dict[str, Any] = {"host_load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)], "host_cores": os.cpu_count(),
                            "plots": plots, "wall_s_by_phase": phases_s}  # fmt: skip
    if sim_problem:
        host["simcheck_problem"] = sim_problem
    table = render(results, not_run, simcheck, wall_s, phases_s)
    print(table, file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.json:
        print(json.dumps(_jsonable(json_object(results, not_run, simcheck, wall_s, host)), sort_keys=False))
    failed = any(why.startswith("failed") for why in not_run.values())
    return 1 if failed else 0
