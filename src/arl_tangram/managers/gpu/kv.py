"""Shell: the KV cache budget of a generating replica, sized from its service's config.

A ``generate`` service declares ``max_batch`` (sequences decoded together) and
``max_context_tokens`` (prompt + new tokens of one sequence; at most the model's own
context). Each replica reserves ``max_batch x max_context_tokens x kv_bytes_per_token``
beside its weights on its home device, so the arena accounting (and the core, which sees
the footprint) counts the cache at its largest; the decode loop admits sequences only
while their worst-case caches fit that reservation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arl_tangram.managers.gpu.errors import InvalidRequestError

if TYPE_CHECKING:
    from arl_tangram.managers.gpu.service import ModelService

DEFAULT_MAX_BATCH = 16


@dataclass(frozen=True)
class KvCacheConfig:
    """``max_context_tokens`` None: the model's context (``max_position_embeddings``)."""

    max_batch: int = DEFAULT_MAX_BATCH
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise InvalidRequestError("max_batch", f"must be an integer >= 1, got {self.max_batch!r}")
        tokens = self.max_context_tokens
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 2):
            raise InvalidRequestError("max_context_tokens", f"must be an integer >= 2, got {tokens!r}")


def kv_bytes_per_token(config: Any, elem_bytes: int) -> int:
    """Bytes of keys and values one token adds to the cache of every layer."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return 2 * int(config.num_hidden_layers) * kv_heads * int(head_dim) * elem_bytes


def kv_budget_bytes(kv: KvCacheConfig, context_tokens: int, per_token_bytes: int) -> int:
    """The reservation of one replica: every batch row at the full context."""
    return kv.max_batch * context_tokens * per_token_bytes


def size_kv_cache(service: ModelService, kv: KvCacheConfig) -> None:
    """Set a ``generate`` service's batch, context and KV reservation from ``kv`` and its
    model's config (at registration, before any replica exists)."""
    model = service.model
    assert model is not None
    config = getattr(model.module, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        raise InvalidRequestError("handler", "generate needs a causal LM with a transformers config")
    context = model.max_length
    if kv.max_context_tokens is not None:
        context = min(context, kv.max_context_tokens)
    model.max_length = context  # requests longer than the cache are refused at parse
    elem = next((p.element_size() for p in model.module.parameters()), 4)
    service.kv_bytes_per_token = kv_bytes_per_token(config, elem)
    service.max_batch = kv.max_batch
    service.kv_cache_bytes = kv_budget_bytes(kv, context, service.kv_bytes_per_token)
