"""The ``generate`` handler on a generated chat LM: greedy output equal to transformers'
own ``generate`` (alone and in a continuous batch), seeded sampling, finish reasons, a
cancelled sequence freeing its KV rows, streaming, the KV reservation in the footprint,
eviction waiting for the batch, and bad input refused naming the field."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.managers.gpu import GpuManager, InvalidRequestError
from arl_tangram.managers.gpu.kv import KvCacheConfig, kv_bytes_per_token

torch = pytest.importorskip("torch")
CHAT_BYTES = 3_000_000
PROMPTS = [[5 + i, 17, 99, 3 + 7 * i, 250 + i][: 3 + i % 3] for i in range(6)]


@pytest.fixture(scope="module")
def chat_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arl_tangram.managers.gpu.generated_lm import generate_chat_lm

    return generate_chat_lm(tmp_path_factory.mktemp("arl-tangram-chat-lm"), CHAT_BYTES, seed=3)


@pytest.fixture(scope="module")
def reference(chat_lm: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(chat_lm), local_files_only=True).eval()


def reference_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.fixture
def judge(make_manager: Callable[..., GpuManager], chat_lm: Path) -> GpuManager:
    manager = make_manager([64 << 20])
    manager.register_folder("judge", chat_lm, "generate", KvCacheConfig(max_batch=8, max_context_tokens=512))
    manager.load("r", "judge", [0])
    return manager


def greedy(prompt: list[int], n: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **extra}


def run_concurrently(manager: GpuManager, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[Any] = [None] * len(requests)

    def one(i: int) -> None:
        out[i] = manager.run("r", requests[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_greedy_equals_transformers_alone_and_batched(judge: GpuManager, reference: Any) -> None:
    n = 24
    expected = [reference_greedy(reference, p, n) for p in PROMPTS]
    alone = judge.run("r", greedy(PROMPTS[0], n))
    assert alone["token_ids"] == expected[0] and alone["finish_reason"] == "length"
    steps_before = judge.generation_status("r")["steps"]
    batched = run_concurrently(judge, [greedy(p, n) for p in PROMPTS])
    assert [b["token_ids"] for b in batched] == expected
    steps = judge.generation_status("r")["steps"] - steps_before
    # decoded together: far fewer steps than the tokens of the requests one after another
    assert steps < len(PROMPTS) * n / 2, steps
    status = judge.generation_status("r")
    assert status["active"] == 0 and status["kv_reserved_bytes"] == 0 and status["kv_bytes_in_use"] == 0


def test_seeded_sampling_is_reproducible(judge: GpuManager) -> None:
    request = {"prompt": PROMPTS[1], "max_tokens": 16, "temperature": 1.5, "top_p": 0.9, "ignore_eos": True}
    first = judge.run("r", {**request, "seed": 11})
    again = run_concurrently(judge, [{**request, "seed": 11}, {**request, "seed": 12}, {**request, "seed": 11}])
    assert again[0]["token_ids"] == first["token_ids"] == again[2]["token_ids"]
    assert again[1]["token_ids"] != first["token_ids"]


def test_max_tokens_and_stop_strings_end_with_their_reason(judge: GpuManager) -> None:
    base = judge.run("r", {"messages": [{"role": "user", "content": "Grade this answer."}], "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert base["finish_reason"] == "length" and base["completion_tokens"] == 12 == len(base["token_ids"])
    text = base["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = judge.run("r", {"messages": [{"role": "user", "content": "Grade this answer."}], "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop]})
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.find(stop)]
    assert stop not in cut["text"] and len(cut["token_ids"]) < 12


def test_logprobs_are_the_models(judge: GpuManager, reference: Any) -> None:
    out = judge.run("r", greedy(PROMPTS[2], 4, logprobs=True, top_logprobs=3))
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPTS[2] + out["token_ids"]])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    for step, entry in enumerate(out["logprobs"]):
        row = logp[len(PROMPTS[2]) - 1 + step]
        assert entry["token_id"] == out["token_ids"][step] == entry["top_logprobs"][0]["token_id"]
        assert entry["logprob"] == pytest.approx(float(row[entry["token_id"]]), abs=1e-3)
        assert len(entry["top_logprobs"]) == 3


def test_a_cancelled_sequence_frees_its_kv_rows(judge: GpuManager) -> None:
    cancel, events, out = threading.Event(), [], {}
    started = threading.Event()

    def on_event(event: dict[str, Any]) -> None:
        events.append(event)
        started.set()

    def long_run() -> None:
        out["r"] = judge.run("r", greedy(PROMPTS[3], 400), on_event, cancel)

    other = threading.Thread(target=lambda: out.setdefault("short", judge.run("r", greedy(PROMPTS[4], 60))))
    thread = threading.Thread(target=long_run)
    thread.start()
    assert started.wait(60)
    other.start()
    time.sleep(0.05)
    held = judge.generation_status("r")["kv_reserved_bytes"]
    assert held >= (len(PROMPTS[3]) + 400) * judge.service_info("judge").kv_cache_bytes // (8 * 512)
    cancel.set()
    thread.join(60)
    assert out["r"]["finish_reason"] == "cancelled" and 0 < len(out["r"]["token_ids"]) < 400
    other.join(60)
    assert out["short"]["finish_reason"] == "length" and len(out["short"]["token_ids"]) == 60
    status = judge.generation_status("r")
    assert status["kv_reserved_bytes"] == 0 and status["kv_bytes_in_use"] == 0 and status["active"] == 0


def test_a_stream_delivers_tokens_while_decoding_runs(judge: GpuManager) -> None:
    stamps: list[float] = []
    deltas: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        stamps.append(time.monotonic())
        deltas.append(event["delta"])

    began = time.monotonic()
    out = judge.run("r", {"prompt": "hello there", "max_tokens": 40, "temperature": 0, "ignore_eos": True}, on_event)
    ended = time.monotonic()
    assert "".join(deltas) == out["text"] and len(stamps) == 40
    # the first token came out early in the run, not with the result
    assert stamps[0] - began < 0.5 * (ended - began) and stamps[0] < stamps[-1]


def test_the_kv_reservation_counts_in_the_footprint(make_manager: Callable[..., GpuManager], chat_lm: Path) -> None:
    manager = make_manager([64 << 20])
    small = manager.register_folder("small", chat_lm, "generate", KvCacheConfig(max_batch=2, max_context_tokens=256))
    large = manager.register_folder("large", chat_lm, "generate", KvCacheConfig(max_batch=8, max_context_tokens=512))
    plain = manager.register_folder("plain", chat_lm, "logprobs")
    from transformers import AutoConfig

    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(str(chat_lm)), 4)
    assert small.kv_cache_bytes == 2 * 256 * per_token and large.kv_cache_bytes == 8 * 512 * per_token
    assert plain.kv_cache_bytes == 0
    assert manager.footprint_bytes("large", 1) - manager.footprint_bytes("plain", 1) >= large.kv_cache_bytes
    before = manager.device_free_bytes()[0]
    manager.load("big", "large", [0])
    assert before - manager.device_free_bytes()[0] == manager.footprint_bytes("large", 1)
    manager.check_invariants()


def test_eviction_waits_for_the_batch_in_flight(judge: GpuManager) -> None:
    out: dict[str, Any] = {}
    first = threading.Event()
    thread = threading.Thread(target=lambda: out.setdefault("r", judge.run("r", greedy(PROMPTS[0], 80), lambda e: first.set())))
    thread.start()
    assert first.wait(60)
    judge.evict("r")  # returns once the sequence in flight has finished
    assert out["r"]["finish_reason"] == "length" and len(out["r"]["token_ids"]) == 80
    thread.join(10)
    assert judge.replica_state("r") == "evicted"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"n": 2}, "n"), ({"temperature": -0.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"), ({"stop": ["a"] * 5}, "stop"), ({"max_tokens": 510}, "messages"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(judge: GpuManager, change: dict[str, Any], field: str) -> None:
    request = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **change}
    with pytest.raises(InvalidRequestError) as info:
        judge.run("r", request)
    assert info.value.field == field


def test_the_tokenizer_is_real_and_sized_to_the_vocabulary(chat_lm: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(chat_lm), local_files_only=True)
    assert len(tokenizer) == 4096 and tokenizer.eos_token_id == 2
    text = "Verdict: 7/10, the answer is café-correct!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text and len(ids) < len(text.encode())
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n")
