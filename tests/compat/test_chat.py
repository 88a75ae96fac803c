"""The generation faces, checked with the unchanged ``openai`` client (sync and async,
streaming and not): ``/v1/chat/completions`` and generating ``/v1/completions`` on a
generated chat LM, greedy output equal to transformers' ``generate``, errors in OpenAI's
shape naming the field; and the SDK's ``tg.call`` on the same service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import GpuConfig, ServiceConfig, TangramConfig
from tests.compat.conftest import serve_compat

openai = pytest.importorskip("openai", reason="the openai client package is not installed")
torch = pytest.importorskip("torch")
TOKEN = "tok-chat"
MESSAGES = [{"role": "user", "content": "Is the answer 42 correct? Reply yes or no."}]


@pytest.fixture(scope="module")
def chat_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arl_tangram.managers.gpu.generated_lm import generate_chat_lm

    return generate_chat_lm(tmp_path_factory.mktemp("arl-tangram-chat-face"), 3_000_000, seed=4)


@pytest.fixture(scope="module")
def judge_server(chat_lm: Path) -> Iterator[ServerThread]:
    services = (
        ServiceConfig("judge", "generate", str(chat_lm), max_batch=8, max_context_tokens=256),
        ServiceConfig("scorer", "logprobs", str(chat_lm)),
    )  # fmt: skip
    config = TangramConfig(gpu=GpuConfig(devices=1, device_mem_bytes=128 << 20), services=services)
    with serve_compat(config, tokens={TOKEN: "alice"}) as s:
        yield s


@pytest.fixture
def client(judge_server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{judge_server.url}/v1", api_key=TOKEN, max_retries=0)


def reference_reply(chat_lm: Path, n: int) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(chat_lm), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(chat_lm), local_files_only=True)
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def test_chat_completion_equals_the_reference(client: openai.OpenAI, chat_lm: Path) -> None:
    r = client.chat.completions.create(
        model="judge", messages=MESSAGES, max_tokens=20, temperature=0, extra_body={"ignore_eos": True},
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == reference_reply(chat_lm, 20)
    assert choice.finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 20
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == 20
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in choice.logprobs.content or [])


def test_chat_stream_delivers_chunks_while_decoding(client: openai.OpenAI, chat_lm: Path) -> None:
    began = time.monotonic()
    stream = client.chat.completions.create(
        model="judge", messages=MESSAGES, max_tokens=60, temperature=0, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    arrivals, parts, reasons = [], [], []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        delta = chunk.choices[0].delta.content
        if delta:
            arrivals.append(time.monotonic())
            parts.append(delta)
        reasons.append(chunk.choices[0].finish_reason)
    ended = time.monotonic()
    assert "".join(parts) == reference_reply(chat_lm, 60) and reasons[-1] == "length"
    assert len(arrivals) > 10 and arrivals[0] - began < 0.7 * (ended - began)


def test_async_client_and_concurrent_judges(judge_server: ServerThread) -> None:
    async def main() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{judge_server.url}/v1", api_key=TOKEN, max_retries=0)
        async with aclient:
            calls = [
                aclient.chat.completions.create(model="judge", messages=[{"role": "user", "content": f"case {i}"}], max_tokens=8, temperature=0.7, seed=5)
                for i in (1, 2, 1)
            ]  # fmt: skip
            replies = await asyncio.gather(*calls)
            stream = await aclient.completions.create(model="judge", prompt="The verdict is", max_tokens=6, temperature=0, stream=True)
            text = "".join([c.choices[0].text async for c in stream])
        return [r.choices[0].message.content or "" for r in replies] + [text]

    first, second, again, streamed = asyncio.run(main())
    assert first == again  # seeded sampling reproduces whatever shares the batch
    assert isinstance(second, str) and isinstance(streamed, str)


def test_concurrent_judges_decode_in_one_batch_through_the_scheduler(judge_server: ServerThread) -> None:
    """Six callers at once: the core runs them on one replica together (its ``max_batch``),
    which decodes them in one batch: far fewer decode steps than their tokens."""
    gpu = judge_server.app.state.api.runtime.agent.gpu

    def steps() -> int:
        replicas = [r for r, v in gpu.status()["replicas"].items() if v["service"].endswith("judge") and v["state"] == "resident"]
        return sum(gpu.generation_status(r)["steps"] for r in replicas)

    async def main() -> list[int]:
        aclient = openai.AsyncOpenAI(base_url=f"{judge_server.url}/v1", api_key=TOKEN, max_retries=0)
        async with aclient:
            calls = [
                aclient.chat.completions.create(model="judge", messages=[{"role": "user", "content": f"case {i}"}], max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
                for i in range(6)
            ]  # fmt: skip
            return [r.usage.completion_tokens for r in await asyncio.gather(*calls) if r.usage]

    client_warm = openai.OpenAI(base_url=f"{judge_server.url}/v1", api_key=TOKEN, max_retries=0)
    client_warm.chat.completions.create(model="judge", messages=MESSAGES, max_tokens=1)  # resident before timing
    before = steps()
    assert asyncio.run(main()) == [30] * 6
    assert steps() - before < 6 * 30 / 2, steps() - before


def test_generating_completion_with_stop(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="judge", prompt="The verdict is", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    text = plain.choices[0].text
    assert plain.choices[0].finish_reason == "length" and text
    stop = text[len(text) // 2 :][:2]
    cut = client.completions.create(model="judge", prompt="The verdict is", max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[: text.find(stop)]


@pytest.mark.parametrize(
    ("change", "param"),
    [({"n": 2}, "n"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"max_tokens": 250}, "messages")],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field(client: openai.OpenAI, change: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{"model": "judge", "messages": MESSAGES, "max_tokens": 8, **change})
    assert info.value.status_code == 400 and info.value.body["param"] == param  # type: ignore[index]


def test_a_service_without_generate_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="scorer", messages=MESSAGES, max_tokens=4)
    assert info.value.body["param"] == "model" and "generate" in info.value.body["message"]  # type: ignore[index]


def test_the_sdk_calls_the_judge(judge_server: ServerThread) -> None:
    from arl_tangram.client import connect

    async def main() -> dict:
        async with connect(judge_server.url, token=TOKEN) as tg:
            result = await tg.call("judge", {"messages": MESSAGES, "max_tokens": 5, "temperature": 0})
            assert result.ok, result.cause
            return dict(result.output)

    out = asyncio.run(main())
    assert out["completion_tokens"] <= 5 and out["finish_reason"] in ("length", "stop")
