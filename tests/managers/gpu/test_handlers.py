"""Real models: MiniLM scores paraphrases above unrelated pairs; teacher log-probs match a
direct forward pass of the same module."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from arl_tangram.managers.gpu import GpuManager

PARAPHRASES = [
    ("A man is playing a guitar.", "Someone is strumming a guitar."),
    ("The cat sleeps on the sofa.", "A cat is napping on the couch."),
    ("How do I reset my password?", "What are the steps to change my password?"),
    ("The tests failed because of a missing import.", "A missing import made the test run fail."),
]
UNRELATED = [
    ("A man is playing a guitar.", "The central bank raised interest rates."),
    ("The cat sleeps on the sofa.", "Quantum computers use qubits."),
    ("How do I reset my password?", "The volcano erupted last night."),
    ("The tests failed because of a missing import.", "She baked bread for the festival."),
]


def test_minilm_scores_paraphrases_above_unrelated_pairs(
    make_manager: Callable[..., GpuManager], minilm: Path
) -> None:
    manager = make_manager([128 << 20])
    manager.register_folder("reward/minilm", minilm, "score")
    manager.load("reward/minilm#0", "reward/minilm", [0])

    async def score_all() -> list[float]:
        pairs = PARAPHRASES + UNRELATED
        results = await asyncio.gather(
            *(manager.run_async("reward/minilm#0", {"a": a, "b": b}) for a, b in pairs)
        )
        return [r["score"] for r in results]

    scores = asyncio.run(score_all())
    para, unrelated = scores[: len(PARAPHRASES)], scores[len(PARAPHRASES) :]
    assert min(para) > max(unrelated), (para, unrelated)
    for p, u in zip(para, unrelated, strict=True):  # each anchor: its paraphrase wins
        assert p > u + 0.3


def test_embeddings_are_unit_vectors_of_minilm_width(
    make_manager: Callable[..., GpuManager], minilm: Path
) -> None:
    manager = make_manager([128 << 20])
    manager.register_folder("minilm", minilm, "embed")
    manager.load("minilm", "minilm", [0])
    data = manager.run("minilm", {"input": ["one", "two words"]})["data"]
    assert [d["index"] for d in data] == [0, 1]
    for d in data:
        vector = torch.tensor(d["embedding"])
        assert vector.shape == (384,)
        assert abs(float(vector.norm()) - 1.0) < 1e-5


# The device the manager's arenas live on in this run (tests/managers/gpu/conftest.py).
DEVICE = (
    "cuda:0"
    if os.environ.get("ARL_TANGRAM_TEST_CUDA") == "1" and torch.cuda.is_available()
    else "cpu"
)


def _direct_logprobs(folder: Path, tokens: list[int]) -> list[float]:
    """Log-probs of ``tokens`` from a plain transformers forward pass on ``DEVICE``."""
    module = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    module = module.to(DEVICE).eval()
    with torch.inference_mode():
        logits = module(input_ids=torch.tensor([tokens], device=DEVICE)).logits[0].cpu()
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [float(logp[t - 1, tokens[t]]) for t in range(1, len(tokens))]


def test_teacher_logprobs_match_a_direct_forward_pass(
    make_manager: Callable[..., GpuManager], teacher_folders: list[Path]
) -> None:
    manager = make_manager([32 << 20])
    manager.register_folder("teacher", teacher_folders[3], "logprobs")
    manager.load("teacher", "teacher", [0])
    sequences = [
        [3, 1, 4, 1, 5, 9, 2, 6],
        [27, 18, 28],
        [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100],
    ]

    async def batched() -> list[dict]:
        return list(
            await asyncio.gather(*(manager.run_async("teacher", {"tokens": s}) for s in sequences))
        )

    single = manager.run("teacher", {"tokens": sequences[0]})
    expected = _direct_logprobs(teacher_folders[3], sequences[0])
    assert single["token_logprobs"][0] is None
    if DEVICE == "cpu":
        assert single["token_logprobs"][1:] == expected  # same kernels, same shapes: bit equal
    else:  # cuBLAS may pick its kernel by the weights' alignment, which the arena sets
        torch.testing.assert_close(
            torch.tensor(single["token_logprobs"][1:]), torch.tensor(expected), rtol=0, atol=1e-5
        )
    for seq, result in zip(sequences, asyncio.run(batched()), strict=True):  # padded batch: close
        assert result["tokens"] == seq
        torch.testing.assert_close(
            torch.tensor(result["token_logprobs"][1:]),
            torch.tensor(_direct_logprobs(teacher_folders[3], seq)),
            rtol=0,
            atol=1e-4,
        )
