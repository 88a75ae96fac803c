"""Shell: module skeletons of a service: built once, rebound to each replica's device copy.

A replica runs the service's module tree with every weight pointing into its own arena
extents. Copying the tree (``copy.deepcopy`` with each weight pre-seeded by an empty
placeholder) costs Python time in proportion to the number of modules, with the GIL held:
for the bench's 0.25 GB Llama (111 modules, 77 tensors) cProfile put it at 53% of a load,
and timed alone it is 4.5-8 ms against a 23 ms copy of the weights on this host, which is
the whole of the swap-efficiency regression (0.93 -> 0.65). Binding a pooled tree to new
views takes 0.4 ms. A swap-in is the copy of host bytes plus that binding, so each service
keeps a pool:
- ``acquire`` hands a load a skeleton no live replica uses: one returned earlier by a
  replica on the same devices, else a fresh one (one is built at registration), else a new
  copy (only while more replicas of the service are live at once than ever before);
- ``Skeleton.bind`` points it at the replica's views: one ``.data`` store per parameter
  (its identity kept, so tied weights follow) and one dict store per buffer owner, through
  references resolved once when the skeleton was built (no name lookups per load);
- ``release`` takes it back after the replica's runs drained (evict, failed load).
A skeleton is used by at most one live replica, so two replicas never share storage.
Returned skeletons are keyed by the replica's devices: state a forward may cache on a module
attribute (a rotary table, say) stays on the device it was made for. A skeleton in the pool
still aliases the arena bytes of its last replica but is unreachable until rebound; ``close``
empties the pool so the arenas can be freed.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Hashable
from typing import Any

import torch

from arl_tangram.managers.gpu.loaded_model import LoadedModel, TensorRef

_COPIED = (torch.Tensor, torch.nn.Module, dict, list, set, tuple)


class Skeleton:
    """A copy of a service's module tree and the slots its weights are bound through."""

    def __init__(self, model: LoadedModel, refs: list[TensorRef]) -> None:
        self.model = model
        self._dtypes = [ref.dtype for ref in refs]
        module = model.module
        self._params: list[torch.nn.Parameter | None] = [
            module.get_parameter(ref.param_name) if ref.param_name is not None else None
            for ref in refs
        ]
        self._buffer_slots: list[list[tuple[dict[str, Any], str]]] = [
            [(module.get_submodule(owner)._buffers, key) for owner, key in ref.buffer_owners]
            for ref in refs
        ]

    def bind(self, tensors: list[torch.Tensor]) -> None:
        """Point every weight at ``tensors`` (one per ref, in ref order). No runs may be in it."""
        for param, slots, tensor in zip(self._params, self._buffer_slots, tensors, strict=True):
            if param is not None:
                param.data = tensor
            for buffers, key in slots:
                buffers[key] = tensor

    def unbind(self) -> None:
        """Point every weight at an empty placeholder, so nothing here keeps arena memory alive
        (module trees may sit in reference cycles that only a later GC pass would free)."""
        self.bind([torch.empty(0, dtype=dtype) for dtype in self._dtypes])


class SkeletonPool:
    """The skeletons of one service. Thread-safe; ``acquire``/``release`` are O(1)."""

    def __init__(self, model: LoadedModel, refs: list[TensorRef], num_prebuilt: int = 1) -> None:
        self._model = model
        self._refs = refs
        self._lock = threading.Lock()
        self._fresh: list[Skeleton] = [self._build() for _ in range(num_prebuilt)]
        self._returned: dict[Hashable, list[Skeleton]] = {}
        self._closed = False
        self.num_built = num_prebuilt

    def acquire(self, devices_key: Hashable) -> Skeleton:
        """A skeleton for a replica on ``devices_key``; exclusive until ``release``."""
        with self._lock:
            returned = self._returned.get(devices_key)
            if returned:
                return returned.pop()
            if self._fresh:
                return self._fresh.pop()
            self.num_built += 1
        return self._build()  # outside the lock: the copy is the slow part

    def release(self, devices_key: Hashable, skeleton: Skeleton) -> None:
        """Take back a skeleton whose replica no run can reach any more (after ``close``:
        unbind it and let it go)."""
        with self._lock:
            if not self._closed:
                self._returned.setdefault(devices_key, []).append(skeleton)
                return
        skeleton.unbind()

    def close(self) -> None:
        """Forget every pooled skeleton (they alias arena bytes). Idempotent."""
        with self._lock:
            self._closed = True
            pooled = [s for group in self._returned.values() for s in group]
            self._fresh.clear()
            self._returned.clear()
        for skeleton in pooled:
            skeleton.unbind()

    @property
    def num_pooled(self) -> int:
        with self._lock:
            return len(self._fresh) + sum(len(s) for s in self._returned.values())

    def _build(self) -> Skeleton:
        return Skeleton(_copy_tree(self._model), self._refs)


def _copy_tree(model: LoadedModel) -> LoadedModel:
    """A copy of the module tree that shares no tensor storage with the host module.

    Every weight is pre-seeded in ``deepcopy``'s memo with an empty placeholder, so only
    the module objects are copied, never the weights. Plain attributes (configs, events,
    callables) are shared: read-only at inference and not always copyable. Containers are
    copied: they hold hooks. Tokenizer and limits are shared.
    """
    memo: dict[int, Any] = {}
    for submodule in model.module.modules():
        for key, value in vars(submodule).items():
            if not key.startswith("_") and not isinstance(value, _COPIED):
                memo[id(value)] = value
    for param in model.module.parameters():
        memo[id(param)] = torch.nn.Parameter(torch.empty(0, dtype=param.dtype), requires_grad=False)
    for buffer in model.module.buffers():
        memo[id(buffer)] = torch.empty(0, dtype=buffer.dtype)
    return dataclasses.replace(model, module=copy.deepcopy(model.module, memo))
