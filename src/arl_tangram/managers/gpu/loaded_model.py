"""What a model loader hands the GPU manager (``LoadedModel``) and how one distinct weight
tensor is found again in the module tree (``TensorRef``); ``service`` lays the weights out,
``skeleton`` rebuilds module trees around them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LoadedModel:
    """What a loader returns: the module plus what handlers need to validate and encode input."""

    module: torch.nn.Module
    tokenizer: Any | None = None
    vocab_size: int | None = None
    max_length: int = 512
    pad_token_id: int = 0
    # Fast (Rust) tokenizers refuse concurrent use from several threads ("Already borrowed").
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class TensorRef:
    """One distinct weight tensor: where it is used in the module tree."""

    dtype: torch.dtype
    shape: torch.Size
    nbytes: int
    param_name: str | None  # qualified name of the Parameter (tied weights: the first owner)
    buffer_owners: list[tuple[str, str]] = field(default_factory=list)  # (module, key)
