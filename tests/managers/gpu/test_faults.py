"""Faults and bad input: failing loaders, unknown services and replicas, malformed requests,
services that never fit, and forward out-of-memory (split the batch)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from arl_tangram.managers.gpu import (
    DuplicateServiceError,
    GpuManager,
    InvalidRequestError,
    LoadedModel,
    NeverFitsError,
    ServiceFailedError,
    ServiceRuntimeError,
    UnknownReplicaError,
    UnknownServiceError,
)


class TinyLM(torch.nn.Module):
    """A real (small) causal scorer used where a fault must be injected into the *model*."""

    def __init__(self, vocab: int = 64, width: int = 16, fail: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)
        self.fail = fail
        self.calls = 0

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.calls += 1
        if self.fail == "oom-when-batched" and input_ids.shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        if self.fail == "always":
            raise RuntimeError("injected model bug")
        return self.head(self.embed(input_ids))


def _tiny(fail: str | None = None) -> Callable[[], LoadedModel]:
    return lambda: LoadedModel(TinyLM(fail=fail), vocab_size=64, max_length=32)


def test_failing_loader_marks_the_service_failed_and_others_keep_serving(
    make_manager: Callable[..., GpuManager], tmp_path: Path
) -> None:
    manager = make_manager([8 << 20])

    def broken() -> torch.nn.Module:
        raise OSError("weights file is corrupt")

    info = manager.register_module("broken", broken, "logprobs")
    assert info.state == "failed" and "weights file is corrupt" in (info.error or "")
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}'
    )
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    assert manager.register_folder("garbage", tmp_path, "logprobs").state == "failed"
    manager.register_module("good", _tiny(), "logprobs")
    with pytest.raises(ServiceFailedError, match="corrupt"):
        manager.load("b0", "broken", [0])
    with pytest.raises(ServiceFailedError):
        asyncio.run(manager.load_async("g0", "garbage", [0]))
    manager.load("ok", "good", [0])
    assert len(manager.run("ok", {"tokens": [1, 2, 3]})["token_logprobs"]) == 3
    assert manager.service_info("broken").state == "failed"
    assert manager.services() == ["broken", "garbage", "good"]


def test_unknown_service_and_replica_name_themselves(
    make_manager: Callable[..., GpuManager],
) -> None:
    manager = make_manager([8 << 20])
    manager.register_module("known", _tiny(), "logprobs")
    with pytest.raises(UnknownServiceError, match=r"unknown service 'nope'.*known"):
        manager.load("r", "nope", [0])
    with pytest.raises(UnknownServiceError):
        manager.footprint_bytes("nope", 1)
    with pytest.raises(UnknownReplicaError, match="'r9'"):
        manager.run("r9", {"tokens": [1]})
    with pytest.raises(UnknownReplicaError):
        asyncio.run(manager.run_async("r9", {"tokens": [1]}))
    with pytest.raises(UnknownReplicaError):
        manager.evict("r9")


@pytest.mark.parametrize(
    ("request_body", "field", "rule"),
    [
        ({}, "tokens", "exactly one of"),
        ({"tokens": [1], "prompt": "x"}, "tokens", "exactly one of"),
        ({"tokens": []}, "tokens", "non-empty"),
        ({"tokens": "abc"}, "tokens", "no tokenizer"),
        ({"tokens": [1, 2.5]}, "tokens", "integer token ids"),
        ({"tokens": [1, 64]}, "tokens", r"\[0, 64\)"),
        ({"tokens": list(range(33))}, "tokens", "at most 32 tokens"),
        (["tokens"], "request", "JSON object"),
    ],
)
def test_malformed_logprobs_requests_name_the_field_and_rule(
    make_manager: Callable[..., GpuManager], request_body: Any, field: str, rule: str
) -> None:
    manager = make_manager([8 << 20])
    manager.register_module("t", _tiny(), "logprobs")
    manager.load("t", "t", [0])
    with pytest.raises(InvalidRequestError, match=rule) as caught:
        manager.run("t", request_body)
    assert caught.value.field == field


def test_malformed_score_and_embed_requests(make_manager: Callable[..., GpuManager]) -> None:
    manager = make_manager([8 << 20])
    manager.register_module("s", _tiny(), "score")
    manager.register_module("e", _tiny(), "embed")
    manager.load("s", "s", [0])
    manager.load("e", "e", [0])
    with pytest.raises(InvalidRequestError, match="'b' is required"):
        manager.run("s", {"a": [1]})
    with pytest.raises(InvalidRequestError, match="'input' is required"):
        manager.run("e", {"inputs": ["x"]})
    with pytest.raises(InvalidRequestError, match=r"input\[1\]"):
        manager.run("e", {"input": [[1], 7]})
    with pytest.raises(InvalidRequestError, match="handler"):
        manager.register_module("x", _tiny(), "generate")


def test_service_that_never_fits_is_rejected_at_registration(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([2 << 20])  # one CUDA granule; the teacher is 3 MB
    with pytest.raises(NeverFitsError, match="bytes"):
        manager.register_folder("big", teacher_folders[0], "logprobs")
    with pytest.raises(NeverFitsError, match="needs"):
        manager.register_module("big2", lambda: TinyLM(vocab=16384, width=64), "logprobs")
    assert manager.status()["services"] == {}
    manager.register_module("big", _tiny(), "logprobs")  # the name is free again


def test_duplicate_registration_is_refused(make_manager: Callable[..., GpuManager]) -> None:
    manager = make_manager([8 << 20])
    manager.register_module("t", _tiny(), "logprobs")
    with pytest.raises(DuplicateServiceError):
        manager.register_module("t", _tiny(), "logprobs")


def test_forward_out_of_memory_splits_the_batch(make_manager: Callable[..., GpuManager]) -> None:
    manager = make_manager([8 << 20], batch_window_s=0.05)
    manager.register_module("oom", _tiny("oom-when-batched"), "logprobs")
    manager.load("oom", "oom", [0])

    async def burst() -> list[dict]:
        return list(
            await asyncio.gather(
                *(manager.run_async("oom", {"tokens": [i, i + 1]}) for i in range(6))
            )
        )

    results = asyncio.run(burst())
    assert [r["tokens"] for r in results] == [[i, i + 1] for i in range(6)]
    module = manager._replicas["oom"].model.module  # type: ignore[union-attr]
    assert module.calls > 6  # the batched attempt failed, the halves succeeded


def test_model_that_raises_fails_its_request_only(make_manager: Callable[..., GpuManager]) -> None:
    manager = make_manager([8 << 20])
    manager.register_module("bug", _tiny("always"), "logprobs")
    manager.register_module("ok", _tiny(), "logprobs")
    manager.load("bug", "bug", [0])
    manager.load("ok", "ok", [0])
    with pytest.raises(ServiceRuntimeError, match="injected model bug"):
        manager.run("bug", {"tokens": [1, 2]})
    assert manager.run("ok", {"tokens": [1, 2]})["tokens"] == [1, 2]
    with pytest.raises(ServiceRuntimeError):
        manager.run("bug", {"tokens": [1, 2]})
