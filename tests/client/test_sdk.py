"""End-to-end through the SDK over both transports (in process, and HTTP to a real server on
loopback): real sandboxes (bubblewrap + cgroups), a local HTTP provider that enforces its own
rate limit with 429s, and the controller loop between them. Every action ends in one defined
outcome; nothing is left behind (the suite's fixture). The controller's internals are read
through ``controller_of`` (for HTTP, the server's controller, read from the test's thread)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import arl_tangram
from arl_tangram.client import AsyncClient, Elastic, SpecError
from arl_tangram.managers.api.config import ProviderConfig
from arl_tangram.runtime.config import GpuConfig, SchedulerConfig, ServiceSettings, TangramConfig
from arl_tangram.runtime.controller import EnvFailedError
from tests.client.conftest import controller_of, serving
from tests.managers.api.provider_server import serve_provider

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
Connector = Callable[..., Any]


async def test_a_no_resource_action_runs_and_reports_its_times(tg: AsyncClient) -> None:
    r = await tg.ping()
    assert r.outcome == "succeeded" and r.kind == "noop"
    assert 0 <= r.queue_s < 1.0 and r.exec_s == 0.0 and r.act_s < 1.0


async def test_exec_files_and_outcomes_in_a_real_sandbox(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    await env.write_file("sol.py", "import sys\nprint(sum(map(int, sys.argv[1:])))\n")
    r = await env.exec("python3 sol.py 2 3 4")
    assert (r.outcome, r.exit_code, r.stdout.strip()) == ("succeeded", 0, "9")
    assert r.exec_s > 0 and r.queue_s >= 0 and r.overhead_s >= 0 and r.node_id == "local/cpu"
    await env.exec("echo state > kept.txt")
    assert (await env.read_file("kept.txt")) == b"state\n"  # state persists across actions
    failed = await env.exec("exit 3")
    assert (failed.outcome, failed.exit_code) == ("failed", 3)
    slow = await env.exec("sleep 5", timeout_s=0.5)
    assert slow.outcome == "timed_out"
    await env.release()


async def test_an_elastic_action_gets_exactly_the_dop_the_decision_named(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    r = await env.exec("echo $TANGRAM_DOP $(nproc)", cpu=Elastic(1, 2, serial_fraction=0.0))
    dop_env, nproc = map(int, r.stdout.split())
    assert r.ok and r.dop == dop_env == nproc  # the decision, the variable and the cpuset agree
    assert 1 <= r.dop <= 2
    fixed = await env.exec("echo $TANGRAM_DOP $(nproc)", cpu=1)
    assert fixed.stdout.split() == ["1", "1"] and fixed.dop == 1
    await env.release()


async def test_a_session_keeps_shell_state_and_its_commands_are_actions(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    async with await env.session() as s:
        await s.run("cd /tmp && export GREETING=hi")
        r = await s.run("echo $GREETING $(pwd) $TANGRAM_DOP")
        assert r.ok and r.stdout.split() == ["hi", "/tmp", "1"] and r.dop == 1
    await env.release()


async def test_bad_input_names_the_field_and_queues_nothing(tg: AsyncClient) -> None:
    with pytest.raises(SpecError, match="image"):
        await tg.create_env(image="ubuntu:22.04")
    with pytest.raises(SpecError, match="cpu.min"):
        Elastic(3, 2)
    with pytest.raises(SpecError, match="name"):
        await tg.call("reward/nothing", {})
    with pytest.raises(SpecError, match="memory"):
        await tg.create_env(memory="lots")
    assert len(controller_of(tg).store) == 0


async def test_a_sandbox_that_fails_to_start_is_an_error_not_a_hang(tg: AsyncClient) -> None:
    # In process the sandbox refuses the id; over HTTP the API refuses it before (422).
    with pytest.raises((EnvFailedError, SpecError), match="sandbox_id|env_id"):
        await asyncio.wait_for(tg.create_env(env_id="bad id/with slash"), 10)
    state = controller_of(tg).loop.state
    assert not any("bad id/with slash" in e for e in state.envs)  # the core freed it


async def test_releasing_an_env_ends_its_running_and_queued_actions(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    # Two cores: two one-core sleeps run, the rest wait in the queue.
    tasks = [asyncio.create_task(env.exec("sleep 30", cpu=1, timeout_s=60)) for _ in range(4)]
    await asyncio.sleep(1.0)
    await env.release()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert {r.outcome for r in results} <= {"cancelled", "error"}, [(r.outcome, r.cause) for r in results]
    assert all(r.cause for r in results)


async def test_closing_the_client_during_calls_cancels_them(connector: Connector) -> None:
    async with connector() as tg:
        env = await tg.create_env(memory="256MiB")
        running = asyncio.create_task(env.exec("sleep 30", timeout_s=60))
        await asyncio.sleep(0.5)
        await asyncio.wait_for(tg.aclose(), 20)
        r = await asyncio.wait_for(running, 5)
        assert r.outcome == "cancelled"


async def test_cancelling_the_caller_stops_the_action(tg: AsyncClient) -> None:
    env = await tg.create_env(memory="256MiB")
    call = asyncio.create_task(env.exec("sleep 30; echo never > out.txt", timeout_s=60))
    await asyncio.sleep(0.5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    r = await env.exec("sleep 0.5; ls")  # the env still works; the cancelled command never wrote
    assert r.ok and "out.txt" not in r.stdout
    assert not controller_of(tg).loop.state.running
    await env.release()


async def test_concurrent_create_exec_session_release_each_end_defined(connector: Connector) -> None:
    async with connector() as tg:
        async def life(i: int) -> list[str]:
            env = await tg.create_env(memory="128MiB")
            outcomes = []
            session = await env.session()
            both = await asyncio.gather(env.exec(f"echo {i}"), session.run("echo s"), return_exceptions=True)
            outcomes += [b.outcome if not isinstance(b, BaseException) else type(b).__name__ for b in both]
            late = asyncio.create_task(env.exec("sleep 10", timeout_s=30))
            await asyncio.sleep(0.05 * (i % 3))
            await env.release()
            try:
                r = await late
            except SpecError as exc:  # over HTTP the release can reach the server first: env gone
                assert exc.field == "env_id", exc
                outcomes.append("cancelled")
            else:
                outcomes.append(r.outcome)
            return outcomes

        results = await asyncio.wait_for(asyncio.gather(*(life(i) for i in range(6))), 60)
    for outcomes in results:
        assert outcomes[:2] == ["succeeded", "succeeded"], outcomes
        assert outcomes[2] in ("cancelled", "error"), outcomes


async def test_api_calls_are_paced_under_the_providers_limit_and_429s_never_leak(connector: Connector) -> None:
    with serve_provider(rps=5.0, burst=1.0) as provider:
        config = TangramConfig(providers=(ProviderConfig("search", provider.base_url, ("test-key-0",), rate_per_s=4.0, max_concurrency=2),))
        async with connector(config) as tg:
            results = await asyncio.gather(*(tg.call("api/search", {"q": f"q{i}"}) for i in range(12)))
            assert all(r.ok and r.exit_code == 200 for r in results), [(r.outcome, r.cause) for r in results]
            assert results[0].output["echo"] == {"q": "q0"}
            assert max(r.queue_s for r in results) > 1.0  # the quota made them wait, in the queue
        assert provider.total_429s() == 0


async def test_a_provider_that_is_down_ends_the_call_as_an_error(connector: Connector) -> None:
    with serve_provider(rps=100.0) as provider:
        config = TangramConfig(providers=(ProviderConfig("search", provider.base_url, ("test-key-0",), max_retries=1, backoff_base_s=0.05),))
        async with connector(config) as tg:
            provider.set_mode("503")
            r = await asyncio.wait_for(tg.call("search", {"q": "x"}, timeout_s=10), 20)
            assert r.outcome in ("error", "failed") and (r.cause or r.exit_code == 503)


def _sync_round_trip(tg: arl_tangram.client.Client) -> None:
    assert tg.ping().ok
    with tg.create_env(memory="128MiB") as env:
        env.write_file("a.txt", "x")
        assert env.exec("cat a.txt").stdout == "x"


def test_the_synchronous_client() -> None:
    with arl_tangram.client.Client() as tg:
        _sync_round_trip(tg)


def test_the_synchronous_client_over_http() -> None:
    with serving() as server, arl_tangram.client.Client(server.url) as tg:
        _sync_round_trip(tg)


async def test_a_real_reward_model_served_as_a_gpu_service(connector: Connector) -> None:
    from arl_tangram.managers.gpu.models import minilm_path

    # over HTTP a folder must be one the operator allows; in process the caller is the operator
    allowed = ServiceSettings(allowed_folders=(str(minilm_path()),))
    config = TangramConfig(gpu=GpuConfig(devices=1, device_mem_bytes=256 << 20), service=allowed)
    async with connector(config) as tg:
        await tg.register_service("reward/minilm", handler="score", folder=str(minilm_path()))
        same, other = await asyncio.gather(
            tg.call("reward/minilm", {"a": "The cat sat on the mat.", "b": "A cat was sitting on the mat."}),
            tg.call("reward/minilm", {"a": "The cat sat on the mat.", "b": "Quarterly revenue rose by four percent."}),
        )
        assert same.ok and other.ok, (same.cause, other.cause)
        assert same.output["score"] > other.output["score"]
        assert same.node_id == "local/gpu" and same.dop == 1
        bad = await tg.call("reward/minilm", {"a": "only one side"})
        assert bad.outcome == "error" and "b" in (bad.cause or "")
        state = controller_of(tg).loop.state
        assert [r.service.rsplit("/", 2)[-2:] for r in state.replicas.values()] == [["reward", "minilm"]]  # the core placed it
        # Concurrent calls on one service, then close during them: each ends defined.
        pair = {"a": "x y z", "b": "x y"}
        calls = [asyncio.create_task(tg.call("reward/minilm", pair)) for _ in range(12)]
        await asyncio.sleep(0.05)
    results = await asyncio.wait_for(asyncio.gather(*calls), 20)
    assert {r.outcome for r in results} <= {"succeeded", "cancelled"}, [(r.outcome, r.cause) for r in results]


async def test_a_model_that_cannot_fit_a_device_is_refused_at_registration(connector: Connector) -> None:
    from arl_tangram.managers.gpu.models import minilm_path

    allowed = ServiceSettings(allowed_folders=(str(minilm_path()),))
    config = TangramConfig(gpu=GpuConfig(devices=2, device_mem_bytes=64 << 20), service=allowed)  # fits two, not one
    async with connector(config) as tg:
        with pytest.raises(SpecError, match="devices_min"):
            await tg.register_service("reward/minilm", handler="score", folder=str(minilm_path()))


async def test_a_pod_style_holding_runs_actions_within_a_real_limit(connector: Connector) -> None:
    config = TangramConfig(scheduler=SchedulerConfig("k8s-static", {"pod_millicores": 1000}))
    async with connector(config) as tg:
        env = await tg.create_env(memory="128MiB")
        r = await env.exec("echo $TANGRAM_DOP $(nproc)")
        assert r.ok and r.stdout.split() == ["1", "1"], (r.outcome, r.cause, r.stdout)
        await env.release()
