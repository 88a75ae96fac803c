"""Shell: run a replica whose modules live on several devices; device context for forwards.

Placement is by module (``layout.plan_shards``): every module's own parameters and buffers
sit on one device. ``install_routing`` hooks *every* module that owns tensors (also those
with children, such as BERT's embeddings that own ``position_ids``): before it runs, its
inputs move to its device and that device becomes current (library code that allocates on
"the current device" lands there, not on ``cuda:0``); after, its output moves back to the
replica's home device, so the code between modules (residuals, masks) sees one device.

``route_log`` (a list, or ``None``) records, per module call, the module, its device index
and the devices its tensor inputs arrived on: the device-shim tests read it on CPU-only
machines, where every device index maps to the same torch device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

_current = threading.local()


class PlacementError(RuntimeError):
    """A module's own tensors were placed on more than one device (a cut inside a module)."""


def module_devices(module: torch.nn.Module, tensor_device: dict[int, int]) -> dict[str, int]:
    """Device index of every module that owns tensors; raises ``PlacementError`` on a split.

    ``tensor_device`` maps ``id(tensor)`` of the module's parameters and buffers to the
    index of the device holding it.
    """
    placement: dict[str, int] = {}
    for name, submodule in module.named_modules():
        own = [p for p in submodule._parameters.values() if p is not None]
        own += [b for b in submodule._buffers.values() if b is not None]
        indices = {tensor_device[id(t)] for t in own if id(t) in tensor_device}
        if len(indices) > 1:
            raise PlacementError(
                f"module {name or '<root>'!r} has tensors on devices {sorted(indices)}"
            )
        if indices:
            placement[name] = indices.pop()
    return placement


def install_routing(
    module: torch.nn.Module,
    placement: dict[str, int],
    devices: Sequence[torch.device],
    home: int,
    route_log: list[tuple[str, int, list[torch.device]]] | None = None,
) -> list[Any]:
    """Hook every placed module; returns the hook handles (``remove()`` them to undo)."""
    handles: list[Any] = []
    for name, submodule in module.named_modules():
        if name not in placement:
            continue
        index = placement[name]

        def before(_m: Any, args: Any, kwargs: Any, n: str = name, i: int = index) -> Any:
            device = devices[i]
            args, kwargs = move(args, device), move(kwargs, device)
            if route_log is not None:
                route_log.append((n, i, [t.device for t in _tensors((args, kwargs))]))
            _push_device(device)
            return args, kwargs

        def after(_m: Any, _args: Any, output: Any) -> Any:
            _pop_device()
            return move(output, devices[home])

        handles.append(submodule.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(submodule.register_forward_hook(after))
    return handles


@contextlib.contextmanager
def device_context(device: torch.device) -> Iterator[None]:
    """Make ``device`` current for a forward pass (CUDA); restores everything on exit."""
    _current.stack = []
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        try:
            yield
        finally:
            _current.stack = []


def _push_device(device: torch.device) -> None:
    stack = getattr(_current, "stack", None)
    if stack is None:
        stack = _current.stack = []
    if device.type == "cuda":
        stack.append(torch.cuda.current_device())
        torch.cuda.set_device(device)
    else:
        stack.append(None)


def _pop_device() -> None:
    stack = getattr(_current, "stack", None)
    if stack:
        previous = stack.pop()
        if previous is not None:
            torch.cuda.set_device(previous)


def move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        # Async only towards CUDA: an async device -> host copy could be read before it lands.
        return value.to(device, non_blocking=device.type == "cuda")
    if isinstance(value, tuple):
        return tuple(move(v, device) for v in value)
    if isinstance(value, list):
        return [move(v, device) for v in value]
    if isinstance(value, dict):
        return {k: move(v, device) for k, v in value.items()}
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
