"""SandboxFusion details a real client tripped over (issue 27, item 6): ``/v1/ping`` under
a tenant's ``/t/<token>/`` prefix, a sign that output was cut at the cap (the ``sandbox-fusion``
client reads the run, raw JSON the flags), and a run whose client gave up is cancelled."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from arl_tangram.api.server import ServerThread
from tests.compat.conftest import needs_sandbox_host, serve_compat

pytest.importorskip("sandbox_fusion", reason="the sandbox-fusion client package is not installed")
from sandbox_fusion import RunCodeRequest, run_code  # noqa: E402

TOKEN = "tok-details"


@contextlib.contextmanager
def _warm_pool() -> Iterator[tuple[ServerThread, Callable[[], list[str]], Callable[[], None], list[str]]]:
    """A server whose pool holds one warm sandbox: (server, the pool's idle envs now, a wait
    until no action runs and some env is idle, the warm envs)."""
    with serve_compat() as s:
        pool = s.app.state.compat.pool

        def idle() -> list[str]:
            return [e for b in pool.buckets.values() for e in b.idle]

        def settle() -> None:
            deadline = time.monotonic() + 10
            while (s.app.state.api.controller.loop.state.running or not idle()) and time.monotonic() < deadline:
                time.sleep(0.05)

        assert httpx.post(f"{s.url}/run_code", json={"code": "print(1)"}, timeout=60).json()["status"] == "Success"
        settle()
        yield s, idle, settle, idle()


def test_ping_under_the_token_prefix_truncation_and_cancel_on_disconnect() -> None:
    needs_sandbox_host()
    with serve_compat(tokens={TOKEN: "alice"}) as s:
        base = f"{s.url}/t/{TOKEN}"
        assert httpx.get(f"{base}/v1/ping").json() == "pong"
        assert httpx.get(f"{s.url}/t/wrong/v1/ping").status_code == 401

        big = run_code(RunCodeRequest(code="import sys; sys.stdout.write('y' * (3 << 20))", language="python"), endpoint=base, max_attempts=1)
        assert big.run_result is not None and len(big.run_result.stdout or "") == 1 << 20  # the cap
        assert "[truncated: stdout exceeded the output cap" in (big.run_result.stderr or "")
        raw = httpx.post(f"{base}/run_code", json={"code": "print('x' * 10)"}, timeout=60).json()
        assert raw["run_result"]["stdout_truncated"] is False and "truncated" not in raw["run_result"]["stderr"]

        controller = s.app.state.api.controller
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on a 60 s program after 1.5 s
            httpx.post(f"{base}/run_code", json={"code": "import time; time.sleep(60)", "run_timeout": 120}, timeout=1.5)
        deadline = time.monotonic() + 10
        while controller.loop.state.running and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not controller.loop.state.running, "the abandoned run was cancelled"


def test_a_sandbox_whose_client_gave_up_mid_run_is_reset_and_reused() -> None:
    """Under overload, clients give up by the hundred; retiring each of their sandboxes made
    the next burst create them again, under the same load (issue 26). Once the abandoned run
    has ended, its sandbox goes back to the pool, reset: the next call gets it, clean."""
    needs_sandbox_host()
    with _warm_pool() as (s, idle, settle, warm):
        assert len(warm) == 1
        program = "open('left-behind', 'w').write('x'); import time; time.sleep(60)"
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on a 60 s program after 1.5 s
            httpx.post(f"{s.url}/run_code", json={"code": program, "run_timeout": 120}, timeout=1.5)
        settle()
        assert idle() == warm, "the abandoned call's sandbox went back to the pool"
        listing = httpx.post(f"{s.url}/run_code", json={"code": "import os; print(os.listdir('.'))"}, timeout=60).json()
        assert "left-behind" not in listing["run_result"]["stdout"], "and was reset before its next call"


def test_a_call_whose_step_cannot_start_in_time_gets_a_504_and_its_sandbox_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that cannot start before the client's timeout is answered 504 and never runs;
    its sandbox goes back to the pool, reset (retiring it cost a destruction and a creation,
    63 of them in one 256-call run of ``bench verdicts``, issue 26)."""
    needs_sandbox_host()
    from arl_tangram.api.compat import sandboxfusion

    with _warm_pool() as (s, idle, settle, warm):
        # no time left for the run once the sandbox is borrowed: the step is turned away
        monkeypatch.setattr(sandboxfusion, "deadline_end", lambda body, arrived: arrived + body.run_timeout)
        assert httpx.post(f"{s.url}/run_code", json={"code": "print(2)"}, timeout=60).status_code == 504
        monkeypatch.undo()
        settle()
        assert idle() == warm, "the turned-away call's sandbox went back to the pool"


def test_a_call_not_answered_before_the_clients_timeout_gets_a_504_and_its_sandbox_is_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """verl scores a read timeout as a sandbox error but retries a 504: a call whose answer
    is not ready ``ANSWER_BY_MARGIN_S`` before verl's read timeout is answered 504 then, its
    run cancelled, its sandbox reset and reused. (The margin is raised here so that a 2.5-s
    program, which starts in time, is not answered in time.)"""
    needs_sandbox_host()
    from arl_tangram.api.compat import sandboxfusion

    with _warm_pool() as (s, idle, settle, warm):
        monkeypatch.setattr(sandboxfusion, "ANSWER_BY_MARGIN_S", 12.5)  # answer within 1.5 s (3 + 1 + 10 - 12.5)
        body = {"code": "import time; time.sleep(2.5); print('late')", "run_timeout": 3, "compile_timeout": 1}
        t0 = time.monotonic()
        r = httpx.post(f"{s.url}/run_code", json=body, timeout=60)
        assert r.status_code == 504 and time.monotonic() - t0 < 2.4, (r.status_code, time.monotonic() - t0)
        monkeypatch.undo()
        settle()
        assert idle() == warm, "the cancelled call's sandbox went back to the pool"
        assert len(s.app.state.compat.retries) == 1  # its retry goes first
