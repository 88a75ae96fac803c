"""Shell: ``arl-tangram bench verdicts``: verl's own reward code under load (issue 26).

N concurrent verl 0.9.1 ``check_correctness`` calls (3 test cases each, ``timeout=3``)
through our SandboxFusion face (``arl-tangram serve`` with preemption on, as shipped
otherwise), against a baseline of the same calls served by a SandboxFusion-style server
that starts every run at once under a 1-core cgroup limit on the same cores
(``verdicts_baseline``). Mixes: ``quarter`` (a quarter each correct, wrong, raising,
looping forever) and ``half-loop`` (half looping, the rest correct/wrong/raising).
Per run (``runs["<N>-<mix>"]``): ``right_verdicts_fraction`` (calls whose every case got
the verdict it deserves), ``client_timeouts`` (calls with a case verl scored -1: its read
timeout of compile + run + 10 s, queue included), ``p50_s``/``p99_s`` of the non-looping
calls' wall time, and ``baseline`` with the same figures. Top level:
``right_verdicts_fraction_min`` (target 1.0), ``client_timeouts_total`` (target 0),
``p99_ratio_max`` (ours / baseline over the runs; target <= 1.0). Figures are as measured.

``--rounds R`` measures every run R times back to back on the same server (as a training
run calls it, step after step), the baseline likewise; a run's figures are then its worst
round's (``worst_round``: the lowest right fraction, the most client timeouts, the highest
p50 and p99), and ``runs[...]["rounds"]`` lists each round's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from arl_tangram.bench.overhead_http import server_process
from arl_tangram.bench.verdicts_baseline import baseline_server
from arl_tangram.runtime.config_sandboxfusion import DEFAULT_MAX_IDLE

CASES = {"inputs": ["1 2\n", "3 4\n", "5 6\n"], "outputs": ["3\n", "7\n", "11\n"]}
CORRECT = ("a, b = map(int, input().split())\nprint(a + b)\n", True)
WRONG = ("a, b = map(int, input().split())\nprint(a - b)\n", False)
RAISING = ("raise SystemExit('boom')\n", -2)
LOOPING = ("while True:\n    pass\n", -3)
MIXES = {"quarter": (CORRECT, WRONG, RAISING, LOOPING), "half-loop": (CORRECT, LOOPING, WRONG, LOOPING, RAISING, LOOPING)}
TIMEOUT_S = 3  # issue 26's setting (verl's default is 10)
_BATCHES = itertools.count()  # numbers the batches of calls (``run_calls``)
#: the server's pool is created at start, as a deployment sized for the batch has it by its
#: second step (``[sandboxfusion] warm_envs``; the pool's default size): the first measured
#: run would otherwise pay for creating most of its sandboxes
WARM_ENVS = DEFAULT_MAX_IDLE
QUANTUM_S = 0.1  # assumption: the cap of a first quantum, ~2x a short python program on this host (0.03-0.06 s of CPU)


def run_calls(url: str, n: int, mix: str) -> dict[str, Any]:
    """All ``n`` calls of ``mix`` at once; their figures."""
    from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

    programs = MIXES[mix]
    jobs = [programs[i % len(programs)] for i in range(n)]

    def call(code: str) -> tuple[list[Any], float]:
        t0 = time.monotonic()
        verdicts = check_correctness(url, CASES, code, TIMEOUT_S)[0]
        return verdicts, time.monotonic() - t0

    # each call's program is a text of its own, in every run and round, as distinct
    # generations are: a server may learn from a program's runs (its test cases are one
    # call's runs), never from another call's or an earlier round's
    batch = next(_BATCHES)
    texts = [f"{code}# generation {batch}-{i}\n" for i, (code, _) in enumerate(jobs)]
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(call, texts))
    right = sum(1 for (_, want), (got, _) in zip(jobs, results, strict=True) if got == [want] * len(CASES["inputs"]))
    timeouts = sum(1 for got, _ in results if -1 in got)
    short = sorted(s for (_, want), (_, s) in zip(jobs, results, strict=True) if want != -3)
    return {
        "calls": n, "right_verdicts_fraction": right / n, "client_timeouts": timeouts,
        "p50_s": round(statistics.median(short), 3), "p99_s": round(short[min(len(short) - 1, int(0.99 * len(short)))], 3),
    }  # fmt: skip


def worst_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's figures over its rounds: each figure at its worst (see the module doc)."""
    if len(rounds) == 1:
        return dict(rounds[0])
    return {
        "calls": rounds[0]["calls"],
        "right_verdicts_fraction": min(r["right_verdicts_fraction"] for r in rounds),
        "client_timeouts": max(r["client_timeouts"] for r in rounds),
        "p50_s": max(r["p50_s"] for r in rounds), "p99_s": max(r["p99_s"] for r in rounds),
        "rounds": rounds,
    }  # fmt: skip


def _config_file(quantum_s: float | None) -> str:
    params = "" if quantum_s is None else f"params = {{ preempt_quantum_s = {quantum_s} }}\n"
    fd, path = tempfile.mkstemp(suffix=".toml", prefix="verdicts-")
    with os.fdopen(fd, "w") as f:
        f.write(f'[scheduler]\npolicy = "elastic"\n{params}\n[sandboxfusion]\nwarm_envs = {WARM_ENVS}\n')
    return path


def measure(sizes: Sequence[int], mixes: Sequence[str], quantum_s: float | None = QUANTUM_S, rounds: int = 1) -> dict[str, Any]:
    logging.getLogger("verl").setLevel(logging.CRITICAL)  # its per-retry warnings would drown the report
    runs: dict[str, dict[str, Any]] = {}
    config = _config_file(quantum_s)
    try:
        with server_process(extra_args=("--config", config)) as url:
            check_warm = run_calls(f"{url}/run_code", 8, "quarter")  # sandboxes created, nothing measured
            del check_warm
            ours = _rounds(f"{url}/run_code", sizes, mixes, rounds)
    finally:
        os.unlink(config)
    with baseline_server() as base_url:
        base = _rounds(base_url, sizes, mixes, rounds)
    for key, r in ours.items():
        runs[key] = dict(worst_round(r), baseline=worst_round(base[key]))
    return {
        "preempt_quantum_s": quantum_s,
        "runs": runs,
        "right_verdicts_fraction_min": min(r["right_verdicts_fraction"] for r in runs.values()),
        "client_timeouts_total": sum(r["client_timeouts"] for r in runs.values()),
        "p99_ratio_max": round(max(r["p99_s"] / max(r["baseline"]["p99_s"], 1e-9) for r in runs.values()), 3),
    }


def _rounds(url: str, sizes: Sequence[int], mixes: Sequence[str], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Each run's figures, round after round on one server: ``{"<N>-<mix>": [round, ...]}``."""
    out: dict[str, list[dict[str, Any]]] = {f"{n}-{mix}": [] for n in sizes for mix in mixes}
    for _ in range(rounds):
        for n in sizes:
            for mix in mixes:
                out[f"{n}-{mix}"].append(run_calls(url, n, mix))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench verdicts", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sizes", default="64,256", help="concurrent calls per run, comma-separated")
    parser.add_argument("--mixes", default=",".join(MIXES), help=f"of {', '.join(MIXES)}")
    parser.add_argument("--no-preemption", action="store_true", help="serve without preemption (the ablation)")
    parser.add_argument("--rounds", type=int, default=1, help="measure each run this many times back to back on one server; report the worst")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: must be an integer >= 1, not {args.rounds}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    mixes = [m for m in args.mixes.split(",") if m]
    for m in mixes:
        if m not in MIXES:
            parser.error(f"--mixes: must be among {', '.join(MIXES)}, not {m!r}")
    result = measure(sizes, mixes, None if args.no_preemption else QUANTUM_S, args.rounds)
    if args.json:
        print(json.dumps(result))
    else:
        for key, r in result["runs"].items():
            b = r["baseline"]
            print(f"{key:>14}: right {r['right_verdicts_fraction']:.3f} (base {b['right_verdicts_fraction']:.3f}), "
                  f"client timeouts {r['client_timeouts']} ({b['client_timeouts']}), p50 {r['p50_s']} s ({b['p50_s']}), "
                  f"p99 {r['p99_s']} s ({b['p99_s']})")  # fmt: skip
    return 0
