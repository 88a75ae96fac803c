"""Shell: run a batch of parsed requests on a resident replica (called on a worker thread).

Out of memory splits the batch in halves (a batch that fits alone still answers); any other
error isolates each request, so one bad input fails only its own caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from arl_tangram.managers.gpu.errors import DeviceOutOfMemoryError, ServiceRuntimeError
from arl_tangram.managers.gpu.handlers import HANDLERS

if TYPE_CHECKING:
    from arl_tangram.managers.gpu.replica import Replica


def run_items(replica: Replica, items: list[Any]) -> list[Any]:
    """One result (or exception instance) per item, in order. The replica is entered."""
    model = replica.model
    assert model is not None
    device = replica.home_device
    name = replica.service.name
    try:
        return HANDLERS[replica.service.handler].run(model, items, device)
    except torch.OutOfMemoryError as exc:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if len(items) == 1:
            return [
                DeviceOutOfMemoryError(
                    f"service {name!r}: out of memory on a single request: {exc}"
                )
            ]
        middle = len(items) // 2
        return run_items(replica, items[:middle]) + run_items(replica, items[middle:])
    except Exception as exc:
        if len(items) > 1:
            return [result for item in items for result in run_items(replica, [item])]
        return [ServiceRuntimeError(f"service {name!r} raised {type(exc).__name__}: {exc}")]
