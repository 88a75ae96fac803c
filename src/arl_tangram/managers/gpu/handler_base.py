"""What a model service's request handler is (``handlers.py`` names them all): ``parse``
validates one request before anything is queued, ``run`` serves a batch of parsed requests
in one pass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from arl_tangram.managers.gpu.service import LoadedModel


class Handler(ABC):
    kind: ClassVar[str]

    @abstractmethod
    def parse(self, request: Any, model: LoadedModel, service: str) -> Any:
        """Validate ``request``; return the parsed form ``run`` takes. Pure, cheap, thread-safe."""

    @abstractmethod
    def run(
        self, model: LoadedModel, items: Sequence[Any], device: torch.device
    ) -> list[dict[str, Any]]:
        """Run parsed requests as one batch on ``device``; one response per item, same order."""
