"""Sandbox side: the elastic HumanEval test runner the coding workload writes into each env.

Stdlib only; it runs inside the sandbox as ``python3 runner.py problem.json solution.py``.
``problem.json`` holds the problem's ``test`` source, its ``entry_point`` and ``reps``, the
number of times the problem's ``check(candidate)`` runs (repeated checks, as a flakiness
run does). The reps are split over ``$TANGRAM_DOP`` forked worker processes; each worker
stops at its first failure. Prints one JSON line ``{"passed", "reps_run", "workers",
"error"}`` and exits 0 when every rep passed, 1 when a check failed, 2 on bad input.

``python3 runner.py --calibrate problems.json`` (run once, before the trajectories) checks
each problem's solutions (``{"task_id", "test", "entry_point", "solutions": {variant:
source}}``) with one check each and times the canonical one's check in CPU seconds; prints
one JSON object ``{task_id: {"verdicts": {variant: passed}, "check_cpu_s"}}``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
import traceback


def _load(solution: str, test: str, entry_point: str) -> tuple[object, object]:
    """(candidate, check) from the solution and the problem's test source, in a fresh namespace."""
    namespace: dict[str, object] = {"__name__": "solution"}
    exec(compile(solution, "solution.py", "exec"), namespace)  # noqa: S102 - the sandbox is the isolation
    exec(compile(test, "test.py", "exec"), namespace)  # noqa: S102
    return namespace[entry_point], namespace["check"]


def _worker(args: tuple[str, str, str, int]) -> tuple[bool, int, str]:
    """Run ``reps`` checks of the solution; (passed, reps that passed, first error)."""
    solution, test, entry_point, reps = args
    done = 0
    try:
        candidate, check = _load(solution, test, entry_point)
        for done in range(reps):  # noqa: B007 - ``done`` is reported on failure
            check(candidate)  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - any failure of the candidate is a verdict
        line = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return False, done, line[:200]
    return True, reps, ""


def _calibrate(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        problems = json.load(f)
    report: dict[str, object] = {}
    for p in problems:
        verdicts = {v: _worker((src, p["test"], p["entry_point"], 1))[0] for v, src in sorted(p["solutions"].items())}
        reps, started = 0, time.process_time()
        if verdicts.get("canonical"):
            candidate, check = _load(p["solutions"]["canonical"], p["test"], p["entry_point"])
            for _ in range(3):  # warm up: the first calls pay for caches and lazy imports
                check(candidate)  # type: ignore[operator]
            started = time.process_time()
            while time.process_time() - started < 0.03 and reps < 100_000:
                check(candidate)  # type: ignore[operator]
                reps += 1
        check_cpu_s = (time.process_time() - started) / reps if reps else 0.0
        report[p["task_id"]] = {"verdicts": verdicts, "check_cpu_s": check_cpu_s}
    print(json.dumps(report))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--calibrate":
        return _calibrate(argv[1])
    if len(argv) != 2:
        print(json.dumps({"passed": False, "error": "usage: runner.py problem.json solution.py"}))
        return 2
    with open(argv[0], encoding="utf-8") as f:
        problem = json.load(f)
    with open(argv[1], encoding="utf-8") as f:
        solution = f.read()
    workers = max(1, int(os.environ.get("TANGRAM_DOP", "1")))
    reps = max(1, int(problem["reps"]))
    workers = min(workers, reps)
    # An even split: worker i runs reps // workers, the first reps % workers one more.
    shares = [reps // workers + (1 if i < reps % workers else 0) for i in range(workers)]
    jobs = [(solution, problem["test"], problem["entry_point"], n) for n in shares]
    if workers == 1:
        results = [_worker(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_worker, jobs, chunksize=1)
    passed = all(ok for ok, _, _ in results)
    error = next((e for ok, _, e in results if not ok), "")
    print(json.dumps({"passed": passed, "reps_run": sum(n for _, n, _ in results), "workers": workers, "error": error}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
