"""Shell: grading a program against stdin/stdout test cases as ONE elastic action.

Where verl posts one SandboxFusion request per test case, this writes the solution and all
cases into an env and runs a small grader there with ``Elastic(1, n)`` cores: the grader
runs ``$TANGRAM_DOP`` cases at a time, so the scheduler decides the parallelism (one case
at a time on a busy node, all at once on an idle one). Verdicts use verl's codes: True
(passed), False (wrong answer), -2 (runtime error), -3 (timeout), -1 (the action itself
did not run to the end: infrastructure).

Ground truth takes verl's SandboxFusion forms, case for case (verl's scorer is the test's
oracle): stdin/stdout cases; ``fn_name`` (LeetCode style: each stdin line is one JSON
argument of the named function, or of ``Solution().<fn_name>``, and the printed return value
is compared); ``assert_case`` (each case's asserts appended to the program; stdin and output
default to empty / not compared).
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
        p = subprocess.run([sys.executable, case["program"]], input=case["input"].encode(),
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


# A call-based case runs the program under this driver: its own code, not verl's, with the
# same observable rules (what is imported for LeetCode-style code, how stdin becomes the
# arguments, how a return value prints), so that both grade a completion alike.
CALL_DRIVER = """
import json, sys, traceback
from typing import *
from collections import *
from itertools import *
from functools import *
from heapq import *
from bisect import *
from math import *
import collections, itertools, functools, heapq, bisect, math, re, string
{code}
def _tangram_call():
    raw = sys.stdin.read()
    try:
        args = [json.loads(line) for line in raw.split("\\n")] if raw.strip() else []
    except json.JSONDecodeError as exc:
        sys.stderr.write(f"bad JSON argument for {fn_name!r}: {{exc}}\\n")
        return
    try:
        fn = globals().get({fn_name!r}) or getattr(globals()["Solution"](), {fn_name!r}, None)
        if fn is None:
            raise NameError({fn_name!r})
        result = fn(*args)
    except Exception:
        sys.stderr.write(traceback.format_exc())
        return
    print(json.dumps(result) if result is None or isinstance(result, (dict, list, tuple, bool)) else str(result))
_tangram_call()
"""


def extract_code(completion: str) -> str | None:
    """The code of a completion by verl's rule: the last ```python block, else the first
    fenced block (minus a language line); None without a fence."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if "```" not in completion:
        return None
    block = completion.split("```")[1]
    first, newline, rest = block.partition("\n")
    return rest if newline and first.strip().isalpha() else block


def parse_cases(ground_truth: Any) -> list[dict[str, Any]]:
    """verl's ground truth (a dict or its JSON: ``inputs``/``outputs``, optional ``fn_name``
    and ``assert_case``) -> ``[{input, output, suffix, fn_name}]``; ValueError names the rule."""
    try:
        data = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    except json.JSONDecodeError as exc:
        raise ValueError(f"ground_truth: must be a dict or its JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("assert_case"), list):
        data = {"inputs": [""] * len(data["assert_case"]), "outputs": [None] * len(data["assert_case"]), **data}
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list) or not isinstance(data.get("outputs"), list):
        raise ValueError("ground_truth: must be {'inputs': [...], 'outputs': [...]} or {'assert_case': [...]} (or its JSON)")
    n = len(data["inputs"])
    suffixes = data.get("assert_case") or [""] * n
    if len(data["outputs"]) != n or len(suffixes) != n:
        raise ValueError("ground_truth: inputs, outputs and assert_case must have the same length")
    fn_name = data.get("fn_name") or None
    return [
        {"input": "" if i is None else str(i), "output": o, "suffix": str(a), "fn_name": fn_name}
        for i, o, a in zip(data["inputs"], data["outputs"], suffixes, strict=True)
    ]


def program_of(code: str, case: dict[str, Any]) -> str:
    """The program one case runs: the code, its asserts, under the call driver for fn_name."""
    body = f"{code}\n\n{case['suffix']}"
    return CALL_DRIVER.format(code=body, fn_name=case["fn_name"]) if case["fn_name"] else body


async def grade(env: Env, code: str, cases: list[dict[str, Any]], *, timeout_s: float, max_dop: int) -> list[Any]:
    """One verdict per case (see the module docstring), from one action in ``env``."""
    if not cases:
        return []
    programs: dict[str, str] = {}  # one file per distinct program (one for stdin/stdout cases)
    runs = []
    for case in cases:
        source = program_of(code, case)
        name = programs.setdefault(source, f".grading/solution{len(programs)}.py")
        runs.append({"input": case["input"], "output": case["output"], "program": name})
    for source, name in programs.items():
        await env.write_file(name, source)
    await env.write_file(".grading/cases.json", json.dumps(runs))
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
