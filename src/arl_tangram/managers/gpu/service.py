"""Shell: one model service's weights: host backup, swap-in into arena blocks, eviction.

A service is initialised once (its module built by a loader), then every weight tensor
(parameters and buffers) is moved into one host buffer laid out exactly like its arena
blocks (pinned on CUDA so copies are DMA and asynchronous). Swap-in copies each block
host -> arena in one piece and re-points every tensor at a typed view of the arena;
eviction re-points them back at the host backup and hands the blocks back. Weights are
read-only, so eviction copies nothing, and an idle resident service can be relocated inside
its arena (compaction): new blocks, an on-device copy, tensors re-pointed.

The manager owns the locking: every method here is called with the manager's lock held,
except that ``module`` is used by forward passes while the service is pinned (``in_use``).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.buddy import Block
from arl_tangram.managers.gpu.layout import Layout, plan_layout, split_balanced


class ServiceState(enum.Enum):
    LOADING = "loading"
    HOST = "host"
    SWAPPING_IN = "swapping_in"
    RESIDENT = "resident"
    FAILED = "failed"


# Valid transitions, one comment per edge; anything else raises.
TRANSITIONS: dict[tuple[ServiceState, ServiceState], str] = {
    (
        ServiceState.LOADING,
        ServiceState.HOST,
    ): "initialised once; weights now live in the host backup",
    (
        ServiceState.LOADING,
        ServiceState.FAILED,
    ): "the loader raised; error kept, others keep serving",
    (
        ServiceState.HOST,
        ServiceState.SWAPPING_IN,
    ): "a request needs it and its blocks were allocated",
    (
        ServiceState.SWAPPING_IN,
        ServiceState.RESIDENT,
    ): "host -> arena copy done; tensors point at the arena",
    (
        ServiceState.SWAPPING_IN,
        ServiceState.HOST,
    ): "the copy raised; blocks go back, tensors stay on host",
    (
        ServiceState.RESIDENT,
        ServiceState.HOST,
    ): "evicted: read-only weights, so the blocks are just released",
}


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
class _TensorRef:
    dtype: torch.dtype
    shape: torch.Size
    nbytes: int
    param: torch.nn.Parameter | None
    owners: list[tuple[torch.nn.Module, str]] = field(default_factory=list)  # buffers only

    def point_at(self, tensor: torch.Tensor) -> None:
        if self.param is not None:
            self.param.data = tensor  # tied weights share the Parameter object: all follow
        for module, key in self.owners:
            module._buffers[key] = tensor


def collect_tensors(module: torch.nn.Module) -> tuple[list[_TensorRef], list[torch.Tensor]]:
    """Every distinct parameter and buffer of ``module`` (shared ones once), in module order."""
    refs: list[_TensorRef] = []
    values: list[torch.Tensor] = []
    seen: dict[int, int] = {}
    for submodule in module.modules():
        for param in submodule._parameters.values():
            if param is not None and id(param) not in seen:
                seen[id(param)] = len(refs)
                refs.append(_TensorRef(param.dtype, param.shape, _nbytes(param), param))
                values.append(param.data)
        for key, buffer in submodule._buffers.items():
            if buffer is None:
                continue
            if id(buffer) not in seen:
                seen[id(buffer)] = len(refs)
                refs.append(_TensorRef(buffer.dtype, buffer.shape, _nbytes(buffer), None))
                values.append(buffer)
            refs[seen[id(buffer)]].owners.append((submodule, key))
    return refs, values


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class Shard:
    """The tensors of one device of a service, their layout and their host backup."""

    tensor_indices: list[int]
    layout: Layout
    host: torch.Tensor  # uint8, layout.total_bytes, blocks back to back


class ModelService:
    """One registered service. Created by the manager; all mutation under the manager's lock."""

    def __init__(self, name: str, kind: str, num_devices: int) -> None:
        self.name = name
        self.kind = kind
        self.num_devices = num_devices
        self.state = ServiceState.LOADING
        self.error: str | None = None
        self.model: LoadedModel | None = None
        self.refs: list[_TensorRef] = []
        self.shards: list[Shard] = []
        self.placement: list[tuple[int, list[Block]]] | None = None  # (device index, blocks)
        self.input_device = torch.device("cpu")
        self.in_use = 0
        self.last_used_seq = 0
        self.num_swap_ins = 0
        self.num_evictions = 0
        self.num_requests = 0
        self.last_swap_in_s = 0.0
        self._hooks: list[Any] = []

    def transition(self, new: ServiceState) -> None:
        if (self.state, new) not in TRANSITIONS:
            raise RuntimeError(
                f"service {self.name!r}: invalid transition {self.state.value} -> {new.value}"
            )
        self.state = new

    @property
    def payload_bytes(self) -> int:
        return sum(shard.layout.payload_bytes for shard in self.shards)

    @property
    def footprint_bytes(self) -> int:
        return sum(shard.layout.total_bytes for shard in self.shards)

    def adopt(self, model: LoadedModel, min_block_bytes: int, align_bytes: int, pin: bool) -> None:
        """Move the freshly built module's weights into the host backup (called once)."""
        model.module.eval()
        model.module.requires_grad_(False)
        self.refs, values = collect_tensors(model.module)
        sizes = [ref.nbytes for ref in self.refs]
        groups = split_balanced(sizes, self.num_devices)
        self.shards = []
        for indices in groups:
            layout = plan_layout([sizes[i] for i in indices], min_block_bytes, align_bytes)
            host = torch.empty(layout.total_bytes, dtype=torch.uint8)
            if pin:  # pin_memory raises without an accelerator: the caller decides
                host = host.pin_memory()
            shard = Shard(indices, layout, host)
            with torch.no_grad():
                for slot in layout.slots:
                    ref_index = indices[slot.index]
                    view = self._host_view(shard, slot.index)
                    view.copy_(values[ref_index])
                    self.refs[ref_index].point_at(view)
            self.shards.append(shard)
        self.model = model

    def _host_view(self, shard: Shard, local: int) -> torch.Tensor:
        slot = shard.layout.slots[local]
        ref = self.refs[shard.tensor_indices[local]]
        if slot.nbytes == 0:
            return torch.empty(ref.shape, dtype=ref.dtype)
        start = shard.layout.host_offset_bytes(slot.block) + slot.offset_bytes
        return shard.host.narrow(0, start, slot.nbytes).view(ref.dtype).view(ref.shape)

    def copy_in(
        self, arenas: Sequence[DeviceArena], placement: list[tuple[int, list[Block]]]
    ) -> None:
        """Copy every shard into its blocks and point the module at the arena views."""
        for shard, (device, blocks) in zip(self.shards, placement, strict=True):
            arena = arenas[device]
            copies = []
            for b, block in enumerate(blocks):
                start = shard.layout.host_offset_bytes(b)
                size = shard.layout.block_sizes_bytes[b]
                copies.append((block.offset_bytes, shard.host.narrow(0, start, size)))
            arena.copy_in(copies)
            self._point_shard_at(arena, shard, blocks)
        self.placement = placement
        self.input_device = arenas[placement[0][0]].device
        devices = {arenas[device].device for device, _ in placement}
        if len(devices) > 1:
            self._install_device_hooks()

    def _point_shard_at(self, arena: DeviceArena, shard: Shard, blocks: list[Block]) -> None:
        for slot in shard.layout.slots:
            ref = self.refs[shard.tensor_indices[slot.index]]
            offset = blocks[slot.block].offset_bytes + slot.offset_bytes
            ref.point_at(arena.typed_view(offset, slot.nbytes, ref.dtype, ref.shape))

    def set_blocks(self, device: int, blocks: list[Block]) -> None:
        """Record that this service's shard on ``device`` now lives in ``blocks`` (compaction).

        Accounting only: the caller copies the bytes, then calls ``repoint``. Until then the
        tensors still alias the old blocks, so the service must stay idle (``in_use == 0``).
        """
        assert self.placement is not None and self.in_use == 0
        self.placement = [(d, blocks if d == device else old) for d, old in self.placement]

    def repoint(self, arena: DeviceArena, device: int) -> None:
        """Point the shard on ``device`` at its current blocks (after a relocation's copies)."""
        assert self.placement is not None
        for shard, (d, blocks) in zip(self.shards, self.placement, strict=True):
            if d == device:
                self._point_shard_at(arena, shard, blocks)

    def point_at_host(self) -> list[tuple[int, list[Block]]]:
        """Re-point every tensor at the host backup; returns the placement to release."""
        for shard in self.shards:
            for slot in shard.layout.slots:
                self.refs[shard.tensor_indices[slot.index]].point_at(
                    self._host_view(shard, slot.index)
                )
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        placement, self.placement = self.placement or [], None
        self.input_device = torch.device("cpu")
        return placement

    def _install_device_hooks(self) -> None:
        """Shards on different devices: every leaf module runs on its weights' device.

        Inputs move to the leaf's device before it runs and its output moves back to the
        first shard's device, so code between leaves (residuals, masks) sees one device.
        """
        assert self.model is not None
        home = self.input_device
        for submodule in self.model.module.modules():
            tensors = list(submodule.parameters(recurse=False)) + list(
                submodule.buffers(recurse=False)
            )
            if not tensors or list(submodule.children()):
                continue
            device = tensors[0].device
            if device == home:
                continue
            self._hooks.append(
                submodule.register_forward_pre_hook(
                    lambda _m, args, kwargs, d=device: (_move(args, d), _move(kwargs, d)),
                    with_kwargs=True,
                )
            )
            self._hooks.append(
                submodule.register_forward_hook(lambda _m, _args, out, d=home: _move(out, d))
            )


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple):
        return tuple(_move(v, device) for v in value)
    if isinstance(value, list):
        return [_move(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value
