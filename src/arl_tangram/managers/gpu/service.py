"""Shell: one registered model service: its module built once, weights in one host copy.

A service is initialised once (its module built by a loader, on the host), then every weight
tensor (parameters and buffers, shared ones once) is moved into one host buffer laid out by
``layout.plan_host_layout`` in module order. Replicas (``replica.py``) are device copies of
that buffer; the host copy is never written again, so any number of replicas may be built
from it at once without a lock.

Pinning (CUDA only; ``pin_memory`` raises without an accelerator): the buffer is allocated
once as ordinary host memory and registered with ``cudaHostRegister``. PyTorch's pinned host
allocator rounds every allocation up to a power of two (a 9 GB service would take 16 GB of
host RAM) and ``tensor.pin_memory()`` would allocate twice; registration does neither.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from arl_tangram.managers.gpu.layout import (
    DEFAULT_ALIGN_BYTES,
    Shard,
    Unit,
    plan_host_layout,
    plan_shards,
)
from arl_tangram.managers.gpu.loaded_model import LoadedModel, TensorRef
from arl_tangram.managers.gpu.skeleton import SkeletonPool


@dataclass(frozen=True)
class ServiceInfo:
    """What the core needs to know of a service (``GpuManager.service_info``)."""

    name: str
    handler: str  # the request handler: "embed", "score", "logprobs", "classify" or "generate"
    weight_bytes: int  # raw bytes of its distinct tensors
    host_bytes: int  # bytes of its host copy (aligned layout)
    state: str  # "ready" or "failed"
    error: str | None
    kv_cache_bytes: int = 0  # generate: KV reservation of one replica (``kv.py``), else 0
    max_batch: int = 1  # generate: sequences one replica decodes together


def collect_tensors(
    module: torch.nn.Module,
) -> tuple[list[TensorRef], list[torch.Tensor], list[Unit]]:
    """Distinct parameters and buffers in module order, and the module that owns each run."""
    refs: list[TensorRef] = []
    values: list[torch.Tensor] = []
    units: list[Unit] = []
    seen: dict[int, int] = {}
    for module_name, submodule in module.named_modules():
        first = len(refs)
        for key, param in submodule._parameters.items():
            if param is not None and id(param) not in seen:
                seen[id(param)] = len(refs)
                name = f"{module_name}.{key}" if module_name else key
                refs.append(TensorRef(param.dtype, param.shape, _nbytes(param), name))
                values.append(param.data)
        for key, buffer in submodule._buffers.items():
            if buffer is None:
                continue
            if id(buffer) not in seen:
                seen[id(buffer)] = len(refs)
                refs.append(TensorRef(buffer.dtype, buffer.shape, _nbytes(buffer), None))
                values.append(buffer)
            refs[seen[id(buffer)]].buffer_owners.append((module_name, key))
        if len(refs) > first:
            units.append(Unit(module_name, first, len(refs) - first))
    return refs, values, units


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def point_tensors(
    module: torch.nn.Module, refs: list[TensorRef], tensors: list[torch.Tensor]
) -> None:
    """Make ``module`` use ``tensors`` (one per ref). Parameters keep their identity, so tied
    weights follow; buffers are replaced in every owner."""
    for ref, tensor in zip(refs, tensors, strict=True):
        if ref.param_name is not None:
            module.get_parameter(ref.param_name).data = tensor
        for owner, key in ref.buffer_owners:
            module.get_submodule(owner)._buffers[key] = tensor


class ModelService:
    """A registered service. Immutable after ``adopt`` (except ``error``); safe to share."""

    def __init__(self, name: str, handler: str) -> None:
        self.name = name
        self.handler = handler
        self.error: str | None = None
        self.model: LoadedModel | None = None
        self.kv_cache_bytes = 0  # set by the manager for ``generate`` services (``kv.py``)
        self.kv_bytes_per_token = 0
        self.max_batch = 1
        self.refs: list[TensorRef] = []
        self.units: list[Unit] = []
        self.host_layout = plan_host_layout([])
        self.host = torch.empty(0, dtype=torch.uint8)
        self._registered_ptr: int | None = None
        self.skeletons: SkeletonPool | None = None  # replicas' module trees (``skeleton.py``)
        self._shards: dict[int, tuple[Shard, ...]] = {}
        self._shards_lock = threading.Lock()

    @property
    def weight_bytes(self) -> int:
        return self.host_layout.payload_bytes

    def info(self) -> ServiceInfo:
        return ServiceInfo(
            self.name,
            self.handler,
            self.weight_bytes,
            self.host_layout.total_bytes,
            "failed" if self.error else "ready",
            self.error,
            self.kv_cache_bytes,
            self.max_batch,
        )

    def adopt(self, model: LoadedModel, pin: bool, align_bytes: int = DEFAULT_ALIGN_BYTES) -> None:
        """Move the freshly built module's weights into the host copy and build the first
        replica skeleton (called once, no lock)."""
        model.module.eval()
        model.module.requires_grad_(False)
        self.refs, values, self.units = collect_tensors(model.module)
        self.host_layout = plan_host_layout([ref.nbytes for ref in self.refs], align_bytes)
        self.host = torch.empty(self.host_layout.total_bytes, dtype=torch.uint8)
        if pin and self.host.numel():
            self._pin()
        views = [self.host_view(i) for i in range(len(self.refs))]
        with torch.no_grad():
            for view, value in zip(views, values, strict=True):
                view.copy_(value)
        point_tensors(model.module, self.refs, views)
        self.skeletons = SkeletonPool(model, self.refs)
        self.model = model

    def _pin(self) -> None:
        cudart = torch.cuda.cudart()
        code = cudart.cudaHostRegister(self.host.data_ptr(), self.host.numel(), 0)
        if int(code) != 0:
            raise RuntimeError(f"cudaHostRegister of {self.host.numel()} bytes failed: {code}")
        self._registered_ptr = self.host.data_ptr()

    def host_view(self, index: int) -> torch.Tensor:
        ref = self.refs[index]
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=ref.dtype)
        start = self.host_layout.offsets_bytes[index]
        return self.host.narrow(0, start, ref.nbytes).view(ref.dtype).view(ref.shape)

    def shards(self, num_devices: int) -> tuple[Shard, ...]:
        """The split of a replica over ``num_devices`` devices (cached; pure function)."""
        with self._shards_lock:
            if num_devices not in self._shards:
                self._shards[num_devices] = plan_shards(self.units, self.host_layout, num_devices)
            return self._shards[num_devices]

    def release_host(self) -> None:
        """Unregister the pinned host copy and empty the skeleton pool (manager close; its
        skeletons alias arena bytes). Idempotent."""
        if self.skeletons is not None:
            self.skeletons.close()
        if self._registered_ptr is not None:
            torch.cuda.cudart().cudaHostUnregister(self._registered_ptr)
            self._registered_ptr = None

    @property
    def is_pinned(self) -> bool:
        return self._registered_ptr is not None


def as_loaded(built: Any) -> LoadedModel:
    """What a ``register_module`` factory returned, as a ``LoadedModel`` (limits read from an
    HF-style ``config`` when the module has one)."""
    if isinstance(built, LoadedModel):
        return built
    if not isinstance(built, torch.nn.Module):
        raise TypeError(
            f"factory must return a torch.nn.Module or LoadedModel, got {type(built).__name__}"
        )
    config = getattr(built, "config", None)
    vocab = getattr(config, "vocab_size", None)
    max_length = getattr(config, "max_position_embeddings", None) or 512
    return LoadedModel(
        module=built, vocab_size=int(vocab) if vocab else None, max_length=int(max_length)
    )
