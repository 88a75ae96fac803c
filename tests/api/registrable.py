"""Factories the registration tests name as ``tests.api.registrable:<name>``: a tiny causal
"LM" (an embedding table read as logits) an operator may allow, and one that raises."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

VOCAB = 16


def build() -> Any:
    import torch

    from arl_tangram.managers.gpu.service import LoadedModel

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.table = torch.nn.Embedding(VOCAB, VOCAB)

        def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
            return SimpleNamespace(logits=self.table(input_ids))

    return LoadedModel(TinyLM(), vocab_size=VOCAB, max_length=8)


def build_broken() -> Any:
    raise RuntimeError("this factory is broken on purpose")


def build_for_tenants() -> Any:
    """The same model under the name an operator lists in ``allowed_modules``."""
    return build()


def build_slow() -> Any:
    """A load that holds its worker thread for a minute; touches ``$TANGRAM_TEST_LOADING``
    first, so a test knows it is under way."""
    import os
    import time
    from pathlib import Path

    Path(os.environ["TANGRAM_TEST_LOADING"]).touch()
    time.sleep(60)
    return build()
