"""Shell: ``arl-tangram sim paper``: run the paper's experiments in simulation and report them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from arl_tangram.sim import paper, report
from arl_tangram.sim.experiments import run_all


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram sim paper", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--report-dir", default="reports/paper", help="where PNG plots and results.json go")
    parser.add_argument("--quick", action="store_true", help="smaller batches and sweeps (a smoke run, not the paper's scale)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    specs = paper.all_specs(quick=args.quick)
    done = 0

    def progress(row: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{len(specs)}] {row['experiment']:<18} {row['label']:<26} batch {row['batch']:<5} "
              f"mean ACT {row['act'].get('mean_s', float('nan')):.3f} s  ({row['wall_s']:.1f} s)", file=sys.stderr)

    rows = run_all(specs, args.workers, progress)
    summary = paper.summarize(rows)
    summary["wall_s"] = time.perf_counter() - t0
    checks = paper.check_targets(summary)
    os.makedirs(args.report_dir, exist_ok=True)
    plot_paths = [] if args.no_plots else report.plots(rows, summary, args.report_dir)
    result = {"summary": summary, "targets": checks, "experiments": _slim(rows), "plots": plot_paths, "quick": args.quick}
    with open(os.path.join(args.report_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result))
        return 0
    for experiment in dict.fromkeys(r["experiment"] for r in rows):
        print(report.table(rows, experiment))
        print()
    print(report.summary_table(checks, summary))
    print("\nparameters (assumptions are labelled in src/arl_tangram/sim/workloads/*.py):")
    for name in ("coding", "deepsearch", "mopd"):
        row = next(r for r in rows if r["experiment"] == name or (name == "coding" and r["experiment"] == "coding"))
        print(f"  {name}: {row['parameters']}")
    print(f"\nplots and results.json in {args.report_dir}")
    return 0


def _slim(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without the bulky series (those live in the plots)."""
    return [{k: v for k, v in r.items() if k not in ("act_quantiles", "cpu_series")} for r in rows]
