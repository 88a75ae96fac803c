"""Shell: the ``generate.*`` figures of ``arl-tangram bench gpu``: a generated chat LM (random
weights, real Llama architecture, a tokenizer trained locally) served by the GPU manager.

- ``tokens_per_s_batched_16``: 16 concurrent requests of exactly 64 new tokens each (EOS
  masked, greedy), decoded in the replica's continuous batch; tokens / wall seconds.
- ``tokens_per_s_serial``: the same requests one after another (``serial_requests`` of them:
  a lone request's rate does not depend on how many follow it).
- ``batch_speedup``: batched / serial tokens per second (target >= 4).
- ``ttft_p50_ms``: submission to first token of the batched requests (median).
- ``swap_in_then_generate_ms``: a cold replica (evicted): load + first token, median of
  ``cold_starts`` (>= 10).
- ``matches_reference``: the greedy outputs, alone and batched, equal token for token what
  transformers' own ``generate`` makes from the same weights and prompts (fp32).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

NUM_CONCURRENT = 16
NEW_TOKENS = 64


def _prompts(n: int) -> list[list[int]]:
    """Distinct judge-sized prompts (token ids) of 24 to 40 tokens, deterministic."""
    return [[(97 * i + 31 * j) % 4000 + 5 for j in range(24 + (i * 7) % 17)] for i in range(n)]


def _request(prompt: list[int], n: int = NEW_TOKENS) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}


def _batched(manager: Any, prompts: list[list[int]]) -> tuple[float, list[float], list[list[int]]]:
    """Wall seconds of all ``prompts`` at once, each one's time to first token, the outputs."""
    ttft: list[float] = [0.0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    go = threading.Barrier(len(prompts) + 1)

    def one(i: int) -> None:
        go.wait()
        submitted = time.perf_counter()
        seen = threading.Event()

        def on_event(_event: dict[str, Any]) -> None:
            if not seen.is_set():
                ttft[i] = time.perf_counter() - submitted
                seen.set()

        outputs[i] = manager.run("judge", _request(prompts[i]), on_event)["token_ids"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    go.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started, ttft, outputs


def _reference(folder: Path, prompts: list[list[int]]) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            out.append([int(t) for t in ids[0, len(p) :]])
    return out


def measure(
    device_spec: Callable[[str, int], Any], cache: Path, size_bytes: int, serial_requests: int = 4,
    cold_starts: int = 10, log: Callable[[str], None] = print,
) -> dict[str, Any]:  # fmt: skip
    from arl_tangram.managers.gpu import GpuManager
    from arl_tangram.managers.gpu.generated_lm import generate_chat_lm
    from arl_tangram.managers.gpu.kv import KvCacheConfig

    folder = generate_chat_lm(cache, size_bytes, seed=7)
    prompts = _prompts(NUM_CONCURRENT)
    context = max(len(p) for p in prompts) + NEW_TOKENS
    kv = KvCacheConfig(max_batch=NUM_CONCURRENT, max_context_tokens=context)
    with GpuManager([device_spec("dev0", 3 * size_bytes + (512 << 20))]) as manager:
        info = manager.register_folder("judge", folder, "generate", kv)
        params = info.weight_bytes // 4
        log(f"generate: {params / 1e6:.0f} M parameters, KV reservation {info.kv_cache_bytes / 1e6:.1f} MB")
        manager.load("judge", "judge", [0])
        manager.run("judge", _request(prompts[0], 2))  # warm-up: first touch, lazy inits
        started = time.perf_counter()
        alone = [manager.run("judge", _request(p))["token_ids"] for p in prompts[:serial_requests]]
        serial_s = time.perf_counter() - started
        log(f"generate: serial {serial_requests} x {NEW_TOKENS} tokens in {serial_s:.2f} s")
        batched_s, ttft, batched = _batched(manager, prompts)
        log(f"generate: {NUM_CONCURRENT} concurrent x {NEW_TOKENS} tokens in {batched_s:.2f} s")
        cold = []
        for _ in range(cold_starts):
            manager.evict("judge")
            started = time.perf_counter()
            manager.load("judge", "judge", [0])
            manager.run("judge", _request(prompts[1], 1))  # returns with its first token
            cold.append(time.perf_counter() - started)
    reference = _reference(folder, prompts[:serial_requests])
    serial_tps = serial_requests * NEW_TOKENS / serial_s
    batched_tps = NUM_CONCURRENT * NEW_TOKENS / batched_s
    return {
        "model_parameters": params, "model_bytes": info.weight_bytes, "kv_cache_bytes": info.kv_cache_bytes,
        "tokens_per_s_serial": serial_tps, "tokens_per_s_batched_16": batched_tps,
        "batch_speedup": batched_tps / serial_tps, "ttft_p50_ms": statistics.median(ttft) * 1e3,
        "swap_in_then_generate_ms": statistics.median(cold) * 1e3, "cold_starts": cold_starts,
        "matches_reference": alone == reference and batched[:serial_requests] == reference,
        "matches_reference_alone": alone == reference,
        "matches_reference_batched": batched[:serial_requests] == reference,
        "serial_requests": serial_requests, "concurrent_requests": NUM_CONCURRENT, "new_tokens": NEW_TOKENS,
    }  # fmt: skip
