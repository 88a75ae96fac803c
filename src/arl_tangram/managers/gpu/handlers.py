"""Shell: request handlers of model services: ``embed``, ``score``, ``logprobs``, ``classify``
and ``generate`` (``generate.py``: decoding, batched continuously by ``decoding.py``).

A handler validates one request (``parse``: raises ``InvalidRequestError`` naming the field
and the rule; runs before anything is queued) and runs a batch of parsed requests through a
resident module (``run``: one forward pass for the whole batch, results in request order).

Request and response shapes follow the OpenAI faces in spirit (PROTOCOLS.md):
- ``embed``:    ``{"input": str | [str] | [int] | [[int]]}`` ->
                ``{"data": [{"index": i, "embedding": [float]}]}`` (mean-pooled, L2-normalised)
- ``score``:    ``{"a": str | [int], "b": str | [int]}`` -> ``{"score": cosine(a, b)}``
- ``logprobs``: ``{"tokens": [int]}`` or ``{"prompt": str}`` ->
                ``{"tokens": [int], "token_logprobs": [None, float, ...]}``, the log-probability
                of each token given the ones before it (as ``/v1/completions`` with ``echo``).
- ``classify``: ``{"input": str | [int], "use_activation": bool = true}`` ->
                ``{"label": int, "probs": [float]}`` from a sequence-classification head (a
                reward model: one logit per class, the last non-padding token's for causal
                LMs): softmax probabilities, or the raw logits with ``use_activation`` false
                (vLLM's ``/classify``, as verl's reward client calls it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from arl_tangram.managers.gpu.errors import InvalidRequestError
from arl_tangram.managers.gpu.generate_handler import GenerateHandler
from arl_tangram.managers.gpu.handler_base import Handler
from arl_tangram.managers.gpu.service import LoadedModel

MAX_INPUTS_PER_REQUEST = 1024


def _require_mapping(request: Any, service: str) -> Mapping[str, Any]:
    if not isinstance(request, Mapping):
        raise InvalidRequestError(
            "request", f"must be a JSON object, got {type(request).__name__}", service
        )
    return request


def _token_ids(value: Any, field: str, model: LoadedModel, service: str) -> list[int]:
    """One sequence: a non-empty string (needs a tokenizer) or a non-empty list of token ids."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequestError(field, "must be a non-empty string", service)
        if model.tokenizer is None:
            raise InvalidRequestError(
                field, "must be a list of token ids: this service has no tokenizer", service
            )
        with model.tokenizer_lock:
            ids = model.tokenizer(value, truncation=True, max_length=model.max_length)["input_ids"]
        return [int(i) for i in ids]
    if not isinstance(value, list) or not value or not all(type(v) is int for v in value):
        raise InvalidRequestError(
            field, "must be a non-empty string or a non-empty list of integer token ids", service
        )
    if len(value) > model.max_length:
        raise InvalidRequestError(
            field, f"must hold at most {model.max_length} tokens, got {len(value)}", service
        )
    vocab = model.vocab_size
    if vocab is not None and not all(0 <= v < vocab for v in value):
        raise InvalidRequestError(field, f"token ids must lie in [0, {vocab})", service)
    return list(value)


def _output_tensor(output: Any, attribute: str) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    found = getattr(output, attribute, None)
    if isinstance(found, torch.Tensor):
        return found
    return output[0]


def _pad(
    sequences: Sequence[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention mask (right padding keeps causal positions exact)."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)


def encode(
    model: LoadedModel, sequences: Sequence[list[int]], device: torch.device
) -> torch.Tensor:
    """Mean-pooled, L2-normalised float32 embeddings, one row per sequence, on the host."""
    ids, mask = _pad(sequences, model.pad_token_id, device)
    hidden = _output_tensor(model.module(input_ids=ids, attention_mask=mask), "last_hidden_state")
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled.float(), p=2.0, dim=-1).cpu()


class EmbedHandler(Handler):
    kind = "embed"

    def parse(self, request: Any, model: LoadedModel, service: str) -> list[list[int]]:
        body = _require_mapping(request, service)
        if "input" not in body:
            raise InvalidRequestError("input", "is required", service)
        value = body["input"]
        if isinstance(value, str) or (isinstance(value, list) and value and type(value[0]) is int):
            return [_token_ids(value, "input", model, service)]
        if not isinstance(value, list) or not value:
            raise InvalidRequestError(
                "input", "must be a string, a list of strings or token-id lists", service
            )
        if len(value) > MAX_INPUTS_PER_REQUEST:
            raise InvalidRequestError(
                "input", f"must hold at most {MAX_INPUTS_PER_REQUEST} items", service
            )
        return [_token_ids(v, f"input[{i}]", model, service) for i, v in enumerate(value)]

    def run(
        self, model: LoadedModel, items: Sequence[list[list[int]]], device: torch.device
    ) -> list[dict[str, Any]]:
        flat = [seq for item in items for seq in item]
        vectors = encode(model, flat, device).tolist()
        out, cursor = [], 0
        for item in items:
            rows = vectors[cursor : cursor + len(item)]
            cursor += len(item)
            out.append({"data": [{"index": i, "embedding": row, "num_tokens": len(seq)} for i, (row, seq) in enumerate(zip(rows, item, strict=True))]})
        return out


class ScoreHandler(Handler):
    kind = "score"

    def parse(self, request: Any, model: LoadedModel, service: str) -> tuple[list[int], list[int]]:
        body = _require_mapping(request, service)
        for name in ("a", "b"):
            if name not in body:
                raise InvalidRequestError(name, "is required", service)
        return (
            _token_ids(body["a"], "a", model, service),
            _token_ids(body["b"], "b", model, service),
        )

    def run(
        self, model: LoadedModel, items: Sequence[tuple[list[int], list[int]]], device: torch.device
    ) -> list[dict[str, Any]]:
        vectors = encode(model, [seq for pair in items for seq in pair], device)
        scores = (vectors[0::2] * vectors[1::2]).sum(dim=-1).tolist()
        return [{"score": s} for s in scores]


class LogprobsHandler(Handler):
    kind = "logprobs"

    def parse(self, request: Any, model: LoadedModel, service: str) -> list[int]:
        body = _require_mapping(request, service)
        if ("tokens" in body) == ("prompt" in body):
            raise InvalidRequestError(
                "tokens",
                "exactly one of 'tokens' (token ids) or 'prompt' (text) is required",
                service,
            )
        field = "tokens" if "tokens" in body else "prompt"
        return _token_ids(body[field], field, model, service)

    def run(
        self, model: LoadedModel, items: Sequence[list[int]], device: torch.device
    ) -> list[dict[str, Any]]:
        ids, mask = _pad(items, model.pad_token_id, device)
        logits = _output_tensor(model.module(input_ids=ids, attention_mask=mask), "logits")
        logprobs = token_logprobs(logits, ids).cpu()
        return [
            {"tokens": list(seq), "token_logprobs": [None, *logprobs[row, : len(seq) - 1].tolist()]}
            for row, seq in enumerate(items)
        ]


class ClassifyHandler(Handler):
    kind = "classify"

    def parse(self, request: Any, model: LoadedModel, service: str) -> tuple[list[int], bool]:
        body = _require_mapping(request, service)
        if "input" not in body:
            raise InvalidRequestError("input", "is required", service)
        activation = body.get("use_activation", True)
        if not isinstance(activation, bool):
            raise InvalidRequestError("use_activation", "must be a boolean", service)
        return _token_ids(body["input"], "input", model, service), activation

    def run(
        self, model: LoadedModel, items: Sequence[tuple[list[int], bool]], device: torch.device
    ) -> list[dict[str, Any]]:
        ids, mask = _pad([seq for seq, _ in items], model.pad_token_id, device)
        logits = _output_tensor(model.module(input_ids=ids, attention_mask=mask), "logits").float().cpu()
        out = []
        for row, (_, activation) in enumerate(items):
            values = torch.softmax(logits[row], dim=-1) if activation else logits[row]
            out.append({"label": int(logits[row].argmax()), "probs": values.tolist()})
        return out


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[B, L-1]``: log p(ids[:, t] | ids[:, :t]) for t >= 1, computed in float32."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


HANDLERS: dict[str, Handler] = {
    h.kind: h
    for h in (EmbedHandler(), ScoreHandler(), LogprobsHandler(), ClassifyHandler(), GenerateHandler())
}
