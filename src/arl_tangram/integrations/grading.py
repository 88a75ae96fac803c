"""Shell: grading a program against stdin/stdout test cases as ONE elastic action.

Where verl posts one SandboxFusion request per test case, this writes the solution and all
cases into an env and runs a small grader there with ``Elastic(1, n)`` cores: the grader
runs ``$TANGRAM_DOP`` cases at a time, so the scheduler decides the parallelism (one case
at a time on a busy node, all at once on an idle one). Verdicts use verl's codes: True
(passed), False (wrong answer), -2 (runtime error), -3 (timeout), -1 (the action itself
did not run to the end: infrastructure).
"""

from __future__ import annotations

import json
from typing import Any

from arl_tangram.client import Elastic, Env

GRADER = r'''
import concurrent.futures, json, os, subprocess, sys
cases = json.load(open(".grading/cases.json"))
timeout_s = float(sys.argv[1])
def run(case):
    try:
        p = subprocess.run([sys.executable, ".grading/solution.py"], input=case["input"].encode(),
                           capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return -3
    if p.returncode != 0:
        return -2
    expected = case["output"]
    return expected is None or p.stdout.decode(errors="replace").rstrip("\n") == str(expected).rstrip("\n")
workers = max(1, int(os.environ.get("TANGRAM_DOP", "1")))
with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    print(json.dumps(list(pool.map(run, cases))))
'''


def extract_code(completion: str) -> str | None:
    """The last fenced code block of a completion (verl's rule); None without one."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    parts = completion.split("```")
    if len(parts) < 3:
        return None
    block = parts[-2]
    first, _, rest = block.partition("\n")
    return rest if first.strip().isalpha() else block


def parse_cases(ground_truth: Any) -> list[dict[str, Any]]:
    """``{"inputs": [...], "outputs": [...]}`` (a dict or its JSON) -> ``[{input, output}]``."""
    data = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) or not isinstance(data.get("outputs"), list):
        raise ValueError("ground_truth: must be {'inputs': [...], 'outputs': [...]} (or its JSON)")
    if len(data["inputs"]) != len(data["outputs"]):
        raise ValueError("ground_truth: inputs and outputs must have the same length")
    return [{"input": str(i), "output": o} for i, o in zip(data["inputs"], data["outputs"], strict=True)]


async def grade(env: Env, code: str, cases: list[dict[str, Any]], *, timeout_s: float, max_dop: int) -> list[Any]:
    """One verdict per case (see the module docstring), from one action in ``env``."""
    if not cases:
        return []
    await env.write_file(".grading/solution.py", code)
    await env.write_file(".grading/cases.json", json.dumps(cases))
    await env.write_file(".grading/grader.py", GRADER)
    dop = max(1, min(max_dop, len(cases)))
    r = await env.exec(
        ["python3", ".grading/grader.py", repr(timeout_s)], cpu=Elastic(1, dop, serial_fraction=0.05),
        timeout_s=timeout_s * len(cases) + 30,  # at DoP 1 the cases run one after another
        kind="grade",
    )  # fmt: skip
    if r.outcome != "succeeded":
        return [-1] * len(cases)
    verdicts: list[Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return verdicts
