"""``compute_score`` against verl's own SandboxFusion scorer as the oracle (issue 27, item 2):
for each ground-truth form verl reads (stdin/stdout, ``fn_name`` call-based, ``assert_case``)
and each outcome, verl's ``check_correctness`` posting to our ``/run_code`` and our one
elastic grading action must give the same verdict, case for case, and the same score."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from arl_tangram.api.server import ServerThread
from tests.integrations.conftest import TOKEN

pytest.importorskip("verl", reason="verl is not installed")
pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """verl's client runs on ``/run_code``, whose pool keeps warm sandboxes from test to test
    by design: the module's server (``serve_compat``) checks its whole life instead."""
    yield

TWO_SUM = "from typing import List\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
FIXTURES: list[tuple[str, dict[str, Any], str]] = [
    ("stdin", {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "11\n"]}, "a, b = map(int, input().split())\nprint(a + b)"),
    (
        "fn_name on Solution",
        {"fn_name": "twoSum", "inputs": ["[2,7,11,15]\n9", "[3,2,4]\n6", "[1,1]\n5"], "outputs": ["[0, 1]", "[1, 2]", "[]"]},
        TWO_SUM + "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n        raise ValueError('none')",
    ),
    (
        "fn_name global, typing names in scope, bool and int results",
        {"fn_name": "is_even", "inputs": ["4", "7", "\"x\""], "outputs": ["true", "false", "false"]},
        "def is_even(n: int) -> bool:\n    xs: List[int] = [n]\n    return xs[0] % 2 == 0",
    ),
    (
        "assert_case",
        {"assert_case": ["assert add(1, 2) == 3", "assert add(2, 2) == 5", "assert add(0, 0) == 0"]},
        "def add(a, b):\n    return a + b",
    ),
    ("timeout", {"fn_name": "spin", "inputs": ["1"], "outputs": ["1"]}, "def spin(n):\n    while True:\n        pass"),
]


@pytest.mark.parametrize(("what", "truth", "code"), FIXTURES, ids=[f[0] for f in FIXTURES])
async def test_verdicts_match_verls_scorer(tangram: ServerThread, what: str, truth: dict[str, Any], code: str) -> None:
    import asyncio

    from verl.utils.reward_score.sandbox_fusion import compute_score as verl_score
    from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

    from arl_tangram.integrations.verl import close_score_clients, compute_score

    url = f"{tangram.url}/t/{TOKEN}/run_code"
    completion = f"Here it is:\n```python\n{code}\n```\n"
    filled = dict(truth)
    if "assert_case" in filled:  # what verl's compute_score fills in before check_correctness
        filled = {"inputs": [""] * len(truth["assert_case"]), "outputs": [None] * len(truth["assert_case"]), **truth}
    expected, _ = await asyncio.to_thread(check_correctness, url, filled, code, 2)
    expected_score, _ = await asyncio.to_thread(verl_score, url, None, 1024, completion, json.dumps(truth), False, 2)
    try:
        ours = await compute_score("code", completion, json.dumps(truth), sandbox_fusion_url=url, timeout=2)
    finally:
        await close_score_clients()
    assert ours["verdicts"] == expected, what
    assert ours["score"] == pytest.approx(expected_score)
    assert any(v is True for v in expected) or what == "timeout"  # each fixture passes somewhere


async def test_unreadable_ground_truth_scores_zero_as_verl_does(tangram: ServerThread) -> None:
    from arl_tangram.integrations.verl import close_score_clients, compute_score

    url = f"{tangram.url}/t/{TOKEN}/run_code"
    try:
        r = await compute_score("code", "```python\nprint(1)\n```", "{not json", sandbox_fusion_url=url)
        assert r["score"] == 0.0 and "ground_truth" in r["error"]
    finally:
        await close_score_clients()
