"""Shell: the ``generate`` handler's request: validation, prompt building, token choice.

Request (one completion; OpenAI's chat and completion fields, vLLM's ``ignore_eos``):
``{"messages": [{"role", "content"}, ...]}`` or ``{"prompt": str | [int]}``, and
``max_tokens`` (default 16), ``temperature`` (default 1.0; 0 = greedy), ``top_p`` (in
(0, 1], default 1), ``seed`` (an int: sampling reproducible), ``stop`` (a string or up to 4),
``n`` (must be 1), ``logprobs`` (bool), ``top_logprobs`` (0..20), ``ignore_eos`` (bool).

Prompt: ``messages`` go through the tokenizer's chat template with the generation prompt
when it has one; otherwise the documented fallback is one ``"<role>: <content>\\n"`` line
per message followed by ``"assistant:"``. A prompt plus ``max_tokens`` over the model's
context is refused, naming ``messages`` (or ``prompt``).

Response: ``{"text", "token_ids", "finish_reason": "stop" | "length" | "cancelled",
"prompt_tokens", "completion_tokens", "logprobs": [{"token_id", "token", "logprob",
"top_logprobs": [...]}] | None}``. EOS (unless ``ignore_eos``) and stop strings end with
``stop``: the EOS token and the stop string are not in ``text``. With ``ignore_eos`` EOS
is never chosen (its logit masked, as transformers' ``min_new_tokens``), so a request
makes exactly ``max_tokens`` tokens unless a stop string ends it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from arl_tangram.managers.gpu.errors import InvalidRequestError
from arl_tangram.managers.gpu.service import LoadedModel

MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class GenerateRequest:
    """A validated generation request (what the decode loop runs)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    eos_token_id: int | None = None  # None: the model has none
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False  # EOS is never chosen (as transformers' min_new_tokens)

    @property
    def max_context_tokens(self) -> int:
        """The most tokens this request's KV cache can hold (its admission reservation)."""
        return len(self.prompt_ids) + self.max_tokens


def _number(body: Mapping[str, Any], name: str, default: float, service: str) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(name, "must be a number", service)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, service: str) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(name, "must be an integer", service)
    return value


def _flag(body: Mapping[str, Any], name: str, service: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequestError(name, "must be a boolean", service)
    return value


def _stop(body: Mapping[str, Any], service: str) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in items)
    ):
        raise InvalidRequestError(
            "stop", f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS}", service
        )
    return tuple(items)


def chat_prompt(messages: Any, model: LoadedModel, service: str) -> list[int]:
    """Token ids of ``messages`` with the generation prompt (chat template or the fallback)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of messages", service)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidRequestError(
                f"messages[{i}]", "must be an object with string 'role' and 'content'", service
            )
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise InvalidRequestError("messages", "needs a tokenizer: this service has none", service)
    turns = [{"role": m["role"], "content": m["content"]} for m in messages]
    with model.tokenizer_lock:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        else:
            text = "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant:"
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


def _prompt(body: Mapping[str, Any], model: LoadedModel, service: str) -> tuple[str, list[int]]:
    if ("messages" in body) == ("prompt" in body):
        raise InvalidRequestError("messages", "exactly one of 'messages' or 'prompt' is required", service)
    if "messages" in body:
        return "messages", chat_prompt(body["messages"], model, service)
    prompt = body["prompt"]
    if isinstance(prompt, str) and prompt and model.tokenizer is not None:
        with model.tokenizer_lock:
            return "prompt", [int(i) for i in model.tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    vocab = model.vocab_size or 0
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int and 0 <= t < vocab for t in prompt):
        raise InvalidRequestError(
            "prompt", f"must be a non-empty string (with a tokenizer) or token ids in [0, {vocab})", service
        )
    return "prompt", list(prompt)


def parse_generate(request: Any, model: LoadedModel, service: str) -> GenerateRequest:
    """Validate a generation request; raises ``InvalidRequestError`` naming the field."""
    if not isinstance(request, Mapping):
        raise InvalidRequestError("request", "must be a JSON object", service)
    n = _integer(request, "n", 1, service)
    if n != 1:
        raise InvalidRequestError("n", f"must be 1 (one completion per request), got {n}", service)
    temperature = _number(request, "temperature", 1.0, service)
    if temperature < 0:
        raise InvalidRequestError("temperature", f"must be >= 0, got {temperature}", service)
    top_p = _number(request, "top_p", 1.0, service)
    if not 0 < top_p <= 1:
        raise InvalidRequestError("top_p", f"must lie in (0, 1], got {top_p}", service)
    max_tokens = _integer(request, "max_tokens", DEFAULT_MAX_TOKENS, service)
    assert max_tokens is not None
    if max_tokens < 1:
        raise InvalidRequestError("max_tokens", f"must be >= 1, got {max_tokens}", service)
    top = _integer(request, "top_logprobs", 0, service) or 0
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError("top_logprobs", f"must lie in [0, {MAX_TOP_LOGPROBS}]", service)
    field, prompt_ids = _prompt(request, model, service)
    if len(prompt_ids) + max_tokens > model.max_length:
        raise InvalidRequestError(
            field, f"has {len(prompt_ids)} tokens; with max_tokens {max_tokens} that exceeds the "
            f"model's context of {model.max_length} tokens", service,
        )  # fmt: skip
    return GenerateRequest(
        tuple(prompt_ids), max_tokens, temperature, top_p, _integer(request, "seed", None, service),
        _stop(request, service), _eos(model), _flag(request, "logprobs", service) or top > 0, top,
        _flag(request, "ignore_eos", service),
    )  # fmt: skip


def _eos(model: LoadedModel) -> int | None:
    tokenizer = model.tokenizer
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is None:
        eos = getattr(getattr(model.module, "config", None), "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return None if eos is None else int(eos)


def make_generator(request: GenerateRequest) -> torch.Generator | None:
    """The request's own random stream (CPU): seeded requests sample reproducibly, whatever
    else shares their batch."""
    if request.temperature == 0:
        return None
    generator = torch.Generator(device="cpu")
    if request.seed is None:
        generator.seed()
    else:
        generator.manual_seed(request.seed)
    return generator


def choose_token(logits: torch.Tensor, request: GenerateRequest, generator: torch.Generator | None) -> int:
    """The next token from one row of float32 CPU logits: greedy, or temperature + top-p."""
    if request.ignore_eos and request.eos_token_id is not None:
        logits = logits.clone()
        logits[request.eos_token_id] = float("-inf")
    if request.temperature == 0 or generator is None:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / request.temperature, dim=-1)
    if request.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the top token always stays)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= request.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def logprob_entry(logits: torch.Tensor, token: int, top: int, decode: Any) -> dict[str, Any]:
    """The chosen token's log-probability (of the model's distribution) and the ``top`` best."""
    logp = torch.log_softmax(logits, dim=-1)
    entry: dict[str, Any] = {"token_id": token, "token": decode([token]), "logprob": float(logp[token])}
    best: Sequence[Any] = []
    if top:
        values, ids = torch.topk(logp, top)
        best = [
            {"token_id": int(i), "token": decode([int(i)]), "logprob": float(v)}
            for v, i in zip(values.tolist(), ids.tolist(), strict=True)
        ]
    entry["top_logprobs"] = list(best)
    return entry
