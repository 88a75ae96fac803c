"""Shell: the ``generate`` handler: requests parsed by ``generate.parse_generate``.

The manager runs ``generate`` requests through the replica's continuous-batching loop
(``decoding.DecodeLoop``), not through ``run``; ``run`` here decodes a static batch to
completion (all items together), for callers that hold a batch already.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from arl_tangram.managers.gpu.decoding import DecodeLoop
from arl_tangram.managers.gpu.generate import GenerateRequest, parse_generate
from arl_tangram.managers.gpu.handler_base import Handler
from arl_tangram.managers.gpu.service import LoadedModel


class GenerateHandler(Handler):
    kind: ClassVar[str] = "generate"

    def parse(self, request: Any, model: LoadedModel, service: str) -> GenerateRequest:
        return parse_generate(request, model, service)

    def run(
        self, model: LoadedModel, items: Sequence[GenerateRequest], device: torch.device
    ) -> list[Any]:
        budget = sum(item.max_context_tokens for item in items)
        loop = DecodeLoop(model, device, len(items), budget, 1)
        return loop.run_batch(list(items))
