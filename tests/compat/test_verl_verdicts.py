"""verl's own ``check_correctness`` under the load that corrupted its rewards (issue 26): 64
concurrent calls, 3 test cases each, a quarter of the programs correct, a quarter wrong, a
quarter raising, a quarter looping forever (``timeout=3``), through our SandboxFusion face
on this host's cores. Every verdict must be right: no call may hit verl's client timeout
(compile + run + 10 s, queue time included). Without preemption (``preempt_quantum_s``
off) the looping runs hold the cores for their whole timeout, one core each, and the short
programs queue behind them past that timeout. Known limit: on a host whose other load
exceeds ~10 runnable tasks it fails with preemption on too (issue 26's notes)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import SchedulerConfig, TangramConfig
from tests.compat.conftest import needs_sandbox_host, serve_compat

pytest.importorskip("verl", reason="verl is not installed")
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness  # noqa: E402

CALLS = 64
CASES = {"inputs": ["1 2\n", "3 4\n", "5 6\n"], "outputs": ["3\n", "7\n", "11\n"]}
PROGRAMS = {  # program -> the verdict verl must give each of its test cases
    "a, b = map(int, input().split())\nprint(a + b)\n": True,
    "a, b = map(int, input().split())\nprint(a - b)\n": False,
    "raise SystemExit('boom')\n": -2,
    "while True:\n    pass\n": -3,
}
QUANTUM_S = 0.1  # PREEMPTION: the cap of a run's first quantum; past it (and 50 ms of its own CPU) while others wait it yields its core


def preempting(quantum_s: float | None) -> TangramConfig:
    params = {} if quantum_s is None else {"preempt_quantum_s": quantum_s}
    return TangramConfig(scheduler=SchedulerConfig("elastic", params))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    needs_sandbox_host()
    with serve_compat(preempting(QUANTUM_S), max_envs=16, max_idle=16) as s:
        yield s


def run_mix(url: str, calls: int = CALLS) -> list[tuple[object, list[object]]]:
    """(expected verdict, verl's verdicts) per call, all calls at once."""
    programs = list(PROGRAMS.items())
    jobs = [programs[i % len(programs)] for i in range(calls)]
    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        futures = [pool.submit(check_correctness, url, CASES, code, 3) for code, _ in jobs]
        return [(want, f.result()[0]) for (_, want), f in zip(jobs, futures, strict=True)]


def test_every_verdict_is_right_at_64_concurrent_calls_with_looping_programs(server: ServerThread) -> None:
    outcomes = run_mix(f"{server.url}/run_code")
    wrong = [(want, got) for want, got in outcomes if got != [want] * len(CASES["inputs"])]
    assert not wrong, f"{len(wrong)} of {CALLS} calls got wrong verdicts (-1: verl's client timed out): {wrong[:6]}"


def test_a_looping_programs_demoted_probe_marks_it_long_before_it_times_out(server: ServerThread) -> None:
    """The core demotes a looping run while other runs wait (the CPU manager's handle tells
    the action's record): the face's program history knows the program as long within its
    3-s timeout, so its other test cases wait behind short programs in the pool
    (``compat.long_programs``, ``pool_lines``). A short program is never marked."""
    import time
    from types import SimpleNamespace

    from arl_tangram.api.compat.long_programs import key

    looping = "while True:\n    pass\n# probed\n"
    # distinct short programs (generations), so their runs queue beside the looping probe:
    # work waiting on the cores is what makes the core demote it
    shorts = [f"input()\nprint({i} - 100)\n# probed\n" for i in range(12)]  # wrong answers
    programs = server.app.state.compat.long_programs
    sent = {code: SimpleNamespace(language="python", code=code + "\n\n") for code in (looping, *shorts)}  # verl appends a case's asserts
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        started = time.monotonic()
        futures = [pool.submit(check_correctness, f"{server.url}/run_code", CASES, code, 3) for code in [looping] * 4 + shorts]
        while not programs.is_long(key("default", sent[looping])) and time.monotonic() - started < 2.5:
            time.sleep(0.01)
        marked_s = time.monotonic() - started
        verdicts = [f.result()[0] for f in futures]
    assert verdicts[:4] == [[-3] * 3] * 4 and all(v == [False, False, False] for v in verdicts[4:]), verdicts
    assert marked_s < 2.5, "the looping program was not known long before its runs timed out: no demotion reached the face"
    assert not any(programs.is_long(key("default", sent[code])) for code in shorts)


def test_a_program_known_long_declares_its_later_runs_long(server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a program is known long, the face declares its later runs so (``t_ori_s`` = the
    run's timeout): the core then demotes them at the floor quantum and the manager at once
    (``preemption.declared_long``, ``PreemptAction.known_long``). Runs of a program never
    seen long declare nothing (their kind's learned T_ori counts)."""
    import time
    from types import SimpleNamespace

    from arl_tangram.api.compat import sandboxfusion
    from arl_tangram.api.compat.long_programs import key

    declared: dict[str, list[float | None]] = {}
    real = sandboxfusion.run_env_action

    async def recording(*args: object, **kwargs: object) -> object:
        step = args[4]
        declared.setdefault(bytes(step.stdin or b"").decode(), []).append(kwargs.get("t_ori_s"))  # type: ignore[attr-defined]
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sandboxfusion, "run_env_action", recording)
    looping = "while True:\n    pass\n# declared\n"
    shorts = [f"input()\nprint({i} - 100)\n# declared\n" for i in range(12)]
    programs = server.app.state.compat.long_programs
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(check_correctness, f"{server.url}/run_code", CASES, code, 3) for code in [looping] * 4 + shorts]
        started = time.monotonic()
        looping_key = key("default", SimpleNamespace(language="python", code=looping + "\n\n"))
        while not programs.is_long(looping_key) and time.monotonic() - started < 5:
            time.sleep(0.01)
        [f.result() for f in futures]
    assert programs.is_long(looping_key)
    declared.clear()
    later = check_correctness(f"{server.url}/run_code", {"inputs": ["7 8\n"], "outputs": ["15\n"]}, looping, 3)[0]
    short = check_correctness(f"{server.url}/run_code", {"inputs": ["9 9\n"], "outputs": ["18\n"]}, shorts[0].replace("# declared", "# fresh"), 3)[0]
    assert later == [-3] and short == [False]
    assert declared == {"7 8\n": [3.0], "9 9\n": [None]}, declared
