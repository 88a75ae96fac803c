"""Builders of the GPU manager tests: small modules with a known behaviour."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from arl_tangram.managers.gpu import LoadedModel


class SlowLM(torch.nn.Module):
    """A real small scorer whose forward takes ``delay_s`` (the run is in flight meanwhile)."""

    def __init__(self, delay_s: float, entered: threading.Event | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64)
        self.delay_s = delay_s
        self.entered = entered

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.entered is not None:
            self.entered.set()
        time.sleep(self.delay_s)
        return self.head(self.embed(input_ids))


def blob(num_mb: int) -> Callable[[], LoadedModel]:
    """A module of ``num_mb`` 1-MiB linear layers (never run: a weight blob to place)."""

    def build() -> LoadedModel:
        layers = [torch.nn.Linear(512, 512, bias=False) for _ in range(num_mb)]
        return LoadedModel(torch.nn.Sequential(*layers), vocab_size=64, max_length=8)

    return build
