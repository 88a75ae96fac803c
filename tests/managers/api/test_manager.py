"""The API-quota manager against a real local provider (tests/managers/api/provider_server.py)
that enforces its own per-key limits with 429 + Retry-After."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from arl_tangram.core.errors import SpecError
from arl_tangram.managers.api import ApiManager, ApiRequest, ApiResult, ProviderConfig
from tests.managers.api.provider_server import ProviderServer, serve_provider

CHAT = ApiRequest(path="/v1/chat/completions", json={"messages": []})


def provider(base_url: str, keys: tuple[str, ...] = ("test-key-0",), **overrides: Any) -> ProviderConfig:
    settings: dict[str, Any] = {"name": "llm", "base_url": base_url, "keys": keys, "backoff_base_s": 0.01}
    settings.update(overrides)
    return ProviderConfig(**settings)


def run_with(config: ProviderConfig, body: Callable[[ApiManager], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with ApiManager([config], seed=1) as manager:
            return await body(manager)

    return asyncio.run(main())


async def burst(manager: ApiManager, n: int, request: ApiRequest = CHAT, **kwargs: Any) -> list[ApiResult]:
    return list(await asyncio.gather(*(manager.call("llm", request, **kwargs) for _ in range(n))))


def max_in_any_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u - t < window_s) for i, t in enumerate(times)), default=0)


def test_pacing_keeps_the_providers_limit_with_zero_429s() -> None:
    with serve_provider(rps=20, burst=2) as server:
        started = time.monotonic()
        results = run_with(provider(server, rate_per_s=16, max_concurrency=32), lambda m: burst(m, 24))
        elapsed_s = time.monotonic() - started
        assert [r.outcome for r in results] == ["succeeded"] * 24
        assert server.total_429s() == 0
        assert sum(r.upstream_429s for r in results) == 0
        assert elapsed_s >= 23 / 16 * 0.9  # paced, not a burst
        assert max_in_any_window(server.stats("test-key-0").accept_times, 1.0) <= 16 + 1


def test_upstream_429s_are_retried_and_counted() -> None:
    # our limit far above the provider's: the provider pushes back and we must cope
    with serve_provider(rps=10, burst=2) as server:
        async def body(manager: ApiManager) -> tuple[list[ApiResult], dict[str, Any]]:
            return await burst(manager, 12), manager.status()

        results, status = run_with(provider(server, rate_per_s=1000, burst=1000, max_retries=10), body)
        assert [r.outcome for r in results] == ["succeeded"] * 12
        assert server.total_429s() > 0
        assert sum(r.upstream_429s for r in results) == server.total_429s()
        assert status["llm"]["upstream_429s"] == server.total_429s()
        assert status["llm"]["keys"]["key0"]["upstream_429s"] == server.total_429s()
        assert all(r.retries >= r.upstream_429s for r in results)
        assert server.stats("test-key-0").accepted == 12


@pytest.mark.parametrize("retry_after", ["seconds", "int"])
def test_retry_after_is_honoured(retry_after: str) -> None:
    # backoff alone would retry within milliseconds and spend every retry on 429s
    with serve_provider(rps=1, burst=1, retry_after=retry_after) as server:
        config = provider(server, rate_per_s=100, burst=100, max_retries=3, backoff_base_s=0.001, backoff_cap_s=0.001)
        started = time.monotonic()
        results = run_with(config, lambda m: burst(m, 2, timeout_s=10))
        assert sorted(r.outcome for r in results) == ["succeeded", "succeeded"]
        assert server.total_429s() == 1
        assert time.monotonic() - started >= 0.9


def test_tokens_per_min_is_enforced_from_usage() -> None:
    with serve_provider(rps=100, burst=100, tokens_per_request=100) as server:
        config = provider(server, rate_per_s=100, burst=100, tokens_per_min=300)

        async def body(manager: ApiManager) -> tuple[list[ApiResult], dict[str, Any]]:
            results = [await manager.call("llm", CHAT, timeout_s=0.5) for _ in range(5)]
            return results, manager.status()

        results, status = run_with(config, body)
        assert [r.outcome for r in results] == ["succeeded"] * 3 + ["timed_out"] * 2
        assert [r.tokens_used for r in results[:3]] == [100, 100, 100]
        assert "tokens_per_min=300" in (results[3].cause or "")
        assert server.stats("test-key-0").tokens == 300
        assert status["llm"]["tokens_used"] == 300


def test_declared_tokens_are_reserved_before_sending() -> None:
    with serve_provider(rps=100, burst=100, delay_s=0.3) as server:
        config = provider(server, rate_per_s=100, burst=100, tokens_per_min=300)
        results = run_with(config, lambda m: burst(m, 3, tokens=150, timeout_s=0.6))
        assert sorted(r.outcome for r in results) == ["succeeded", "succeeded", "timed_out"]
        assert server.stats("test-key-0").max_in_flight == 2
        # usage (100) replaces the declaration (150) once the answer reports it
        assert sorted(r.tokens_used for r in results) == [0, 100, 100]


def test_concurrency_cap_is_held() -> None:
    with serve_provider(rps=1000, burst=1000, delay_s=0.2) as server:
        config = provider(server, rate_per_s=1000, burst=1000, max_concurrency=2)

        async def body(manager: ApiManager) -> tuple[list[ApiResult], int]:
            seen = 0

            async def watch() -> None:
                nonlocal seen
                while True:
                    seen = max(seen, manager.status()["llm"]["in_flight"])
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            try:
                return await burst(manager, 6), seen
            finally:
                watcher.cancel()

        started = time.monotonic()
        results, seen = run_with(config, body)
        assert [r.outcome for r in results] == ["succeeded"] * 6
        assert server.stats("test-key-0").max_in_flight == 2
        assert seen == 2
        assert time.monotonic() - started >= 0.55  # three waves of two
        assert sum(r.waited_s > 0 for r in results) >= 4


def test_key_pool_spreads_load_over_keys() -> None:
    keys = ("test-key-a", "test-key-b")
    with serve_provider(rps=5, burst=2, keys=keys) as server:
        started = time.monotonic()
        results = run_with(provider(server, keys=keys, rate_per_s=4), lambda m: burst(m, 12))
        elapsed_s = time.monotonic() - started
        assert [r.outcome for r in results] == ["succeeded"] * 12
        assert server.total_429s() == 0
        accepted = [server.stats(k).accepted for k in keys]
        assert sum(accepted) == 12 and abs(accepted[0] - accepted[1]) <= 2
        assert elapsed_s < 11 / 4  # faster than one key could


def test_down_provider_ends_in_error_naming_it_then_recovers() -> None:
    with serve_provider() as server:
        config = provider(server, max_retries=2)
        server.set_mode("down")

        async def body(manager: ApiManager) -> tuple[ApiResult, ApiResult]:
            down = await manager.call("llm", CHAT, timeout_s=10)
            server.set_mode("up")
            return down, await manager.call("llm", CHAT, timeout_s=10)

        started = time.monotonic()
        down, up = run_with(config, body)
        assert down.outcome == "error"
        assert down.cause is not None and "'llm'" in down.cause and "unreachable" in down.cause
        assert server in down.cause and "ConnectError" in down.cause
        assert down.retries == 2 and down.status is None
        assert time.monotonic() - started < 5
        assert up.outcome == "succeeded"


def test_hanging_provider_ends_in_error_or_timed_out_never_a_hang() -> None:
    with serve_provider() as server:
        server.set_mode("hang")
        per_attempt = provider(server, max_retries=1, request_timeout_s=0.2)
        result = run_with(per_attempt, lambda m: m.call("llm", CHAT, timeout_s=10))
        assert result.outcome == "error"
        assert result.cause is not None and "timed out" in result.cause and result.retries == 1
        whole_call = provider(server, request_timeout_s=30)
        result = run_with(whole_call, lambda m: m.call("llm", CHAT, timeout_s=0.3))
        assert result.outcome == "timed_out" and "timeout_s=0.3" in (result.cause or "")


def test_503_after_retries_is_a_failed_answer() -> None:
    with serve_provider() as server:
        server.set_mode("503")
        result = run_with(provider(server, max_retries=2), lambda m: m.call("llm", CHAT))
        assert (result.outcome, result.status, result.retries) == ("failed", 503, 2)
        assert result.body == {"error": "overloaded"}


def test_waiting_for_quota_is_bounded_by_the_calls_timeout() -> None:
    with serve_provider(delay_s=5) as server:
        config = provider(server, max_concurrency=1)

        async def body(manager: ApiManager) -> ApiResult:
            holder = asyncio.create_task(manager.call("llm", CHAT, timeout_s=10))
            await wait_until(lambda: manager.status()["llm"]["in_flight"] == 1)
            waiter = await manager.call("llm", CHAT, timeout_s=0.3)
            holder.cancel()
            return waiter

        result = run_with(config, body)
        assert result.outcome == "timed_out"
        assert result.cause is not None and "no quota on provider 'llm'" in result.cause
        assert result.waited_s >= 0.25


def test_cancelling_a_call_frees_its_slot() -> None:
    with serve_provider(delay_s=5) as server:
        config = provider(server, max_concurrency=1)

        async def body(manager: ApiManager) -> tuple[dict[str, Any], ApiResult]:
            call = asyncio.create_task(manager.call("llm", CHAT, timeout_s=10))
            await wait_until(lambda: manager.status()["llm"]["in_flight"] == 1)
            queued = asyncio.create_task(manager.call("llm", CHAT, timeout_s=10))
            await wait_until(lambda: manager.status()["llm"]["waiting"] == 1)
            for task in (queued, call):
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            after = manager.status()["llm"]
            quick = ApiRequest(path="/v1/chat/completions", json={"delay_s": 0})
            return after, await manager.call("llm", quick, timeout_s=2)

        after, result = run_with(config, body)
        assert (after["in_flight"], after["waiting"]) == (0, 0)
        assert result.outcome == "succeeded"


def test_close_ends_in_flight_calls_cancelled() -> None:
    with serve_provider() as server:
        server.set_mode("hang")

        async def main() -> tuple[ApiResult, ApiResult]:
            manager = ApiManager([provider(server)])
            call = asyncio.create_task(manager.call("llm", CHAT, timeout_s=10))
            await wait_until(lambda: manager.status()["llm"]["in_flight"] == 1)
            await manager.aclose()
            await manager.aclose()  # idempotent
            return await call, await manager.call("llm", CHAT)

        in_flight, later = asyncio.run(main())
        assert in_flight.outcome == "cancelled"
        assert later.outcome == "error" and "closed" in (later.cause or "")


def test_keys_are_sent_with_the_configured_header_and_never_exposed() -> None:
    secret = "sk-live-TOPSECRET-42"
    with serve_provider(keys=(secret,), auth_header="x-api-key", auth_scheme="") as server:
        right = provider(server, keys=(secret,), auth_header="x-api-key", auth_scheme="")
        wrong = provider(server, keys=(secret,))  # Authorization: Bearer ...: the server refuses

        async def body(manager: ApiManager) -> tuple[ApiResult, str]:
            return await manager.call("llm", CHAT), repr(manager.status())

        ok, status = run_with(right, body)
        refused, _ = run_with(wrong, body)
        assert ok.outcome == "succeeded" and ok.body["usage"]["total_tokens"] == 100
        assert (refused.outcome, refused.status) == ("failed", 401)
        for text in (repr(ok), repr(refused), status, repr(right)):
            assert secret not in text


def test_bad_arguments_name_the_field() -> None:
    with serve_provider() as server:
        async def body(manager: ApiManager) -> list[str]:
            fields = []
            for kwargs in (
                {"provider": "nope"},
                {"timeout_s": 0},
                {"timeout_s": float("nan")},
                {"tokens": -1},
                {"request": ApiRequest(headers={"authorization": "Bearer mine"})},
            ):
                args: dict[str, Any] = {"provider": "llm", "request": CHAT, **kwargs}
                with pytest.raises(SpecError) as info:
                    await manager.call(args.pop("provider"), args.pop("request"), **args)
                fields.append(info.value.field)
            return fields

        fields = run_with(provider(server), body)
        assert fields == ["provider", "timeout_s", "timeout_s", "tokens", "request.headers"]
    with pytest.raises(SpecError, match="must be unique"):
        ApiManager([provider("http://127.0.0.1:9"), provider("http://127.0.0.1:9")])


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_provider_server_is_a_base_url() -> None:
    with serve_provider(rps=3) as server:
        assert isinstance(server, ProviderServer) and isinstance(server, str)
        assert server.base_url == server and server.startswith("http://127.0.0.1:")
