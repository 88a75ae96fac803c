"""verl's own SandboxFusion client (``check_correctness``, one POST per test case, retries
only on 504) against our ``/run_code``: each outcome gives verl's expected code
(True, False, -2 runtime error, -3 timeout, -4 compile error)."""

from __future__ import annotations

import pytest

from arl_tangram.api.server import ServerThread

pytest.importorskip("verl", reason="verl is not installed")
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness  # noqa: E402

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_verl_result_codes(server: ServerThread) -> None:
    url = f"{server.url}/run_code"
    cases = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    assert check_correctness(url, cases, ADD)[0] == [True, True]
    assert check_correctness(url, cases, "a, b = map(int, input().split())\nprint(a - b)\n")[0] == [False, False]
    assert check_correctness(url, {"inputs": ["1 2"], "outputs": ["3"]}, "raise SystemExit('boom')")[0] == [-2]
    assert check_correctness(url, {"inputs": ["1 2"], "outputs": ["3"]}, "while True: pass", timeout=1)[0] == [-3]
    cpp = {"inputs": ["1 2"], "outputs": ["3"]}
    assert check_correctness(url, cpp, "int main( {", language="cpp")[0] == [-4]
    good_cpp = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}"
    assert check_correctness(url, cpp, good_cpp, language="cpp")[0] == [True]


def test_verl_many_concurrent_cases(server: ServerThread) -> None:
    n = 48
    cases = {"inputs": [f"{i} {i}\n" for i in range(n)], "outputs": [f"{2 * i}\n" if i % 5 else "wrong\n" for i in range(n)]}
    results, _ = check_correctness(f"{server.url}/run_code", cases, ADD)
    assert results == [bool(i % 5) for i in range(n)]
