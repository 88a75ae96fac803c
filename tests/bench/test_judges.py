"""The DeepSearch workload's judges (``--judge``): the generative one asks a generated chat
LM for a verdict through the ``generate`` handler, batched on one replica like the live run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from arl_tangram.bench.live.judges import GENERATIVE_KV, GENERATIVE_MAX_TOKENS, JudgeModel

pytest.importorskip("torch")


def test_the_generative_judge_gives_a_verdict_per_answer(tmp_path: Path) -> None:
    from arl_tangram.managers.gpu import GpuManager, cpu_devices
    from arl_tangram.managers.gpu.generated_lm import generate_chat_lm

    judge = JudgeModel("judge/generative", "generate", generate_chat_lm(tmp_path / "arl-tangram-judge", 3_000_000, seed=11), **GENERATIVE_KV)
    request = judge.request("def f(): return 1", "Write f returning one." * 100)
    assert request["max_tokens"] == GENERATIVE_MAX_TOKENS and request["messages"][-1]["role"] == "user"
    scores: list[float] = []
    with GpuManager(cpu_devices([128 << 20])) as gpu:
        gpu.register_folder(judge.name, judge.folder, judge.handler, judge.kv())
        gpu.load("j", judge.name, [0])
        threads = [threading.Thread(target=lambda: scores.append(judge.score(gpu.run("j", request)))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert gpu.generation_status("j")["steps"] < 4 * GENERATIVE_MAX_TOKENS  # the four decoded together
    assert len(scores) == 4 and set(scores) <= {0.0, 1.0} and len(set(scores)) == 1  # greedy: one verdict
