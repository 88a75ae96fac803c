"""Shell: one pre-allocated arena tensor per device, carved into typed views.

The arena is a single ``uint8`` tensor of the device's budget, allocated once (CUDA:
``torch.empty`` on the GPU; CPU: host memory, touched once so its pages are really committed
and the first swap-in does not pay page faults). ``BuddyModel`` decides offsets; this module
only turns ``(offset, dtype, shape)`` into views, and copies bytes in (host -> arena) and
within (arena -> arena, for compaction).
"""

from __future__ import annotations

from typing import Any

import torch

from arl_tangram.managers.gpu.buddy import BuddyModel
from arl_tangram.managers.gpu.devices import DeviceSpec


class DeviceArena:
    """The arena of one device and its allocator. Not thread-safe: the manager serialises use."""

    def __init__(self, spec: DeviceSpec, min_block_bytes: int) -> None:
        self.spec = spec
        self.device = torch.device(spec.torch_device)
        self.allocator = BuddyModel(spec.mem_bytes, min_block_bytes)
        self.buffer = torch.empty(
            self.allocator.capacity_bytes, dtype=torch.uint8, device=self.device
        )
        if spec.kind == "cpu":
            self.buffer.zero_()  # commit the pages now, not during the first swap-in
        self.copy_stream: Any = torch.cuda.Stream(self.device) if spec.kind == "cuda" else None
        # Compaction counters (reported by ``GpuManager.status``).
        self.num_relocations = 0
        self.relocated_bytes = 0
        self.relocation_s = 0.0

    @property
    def is_cuda(self) -> bool:
        return self.spec.kind == "cuda"

    def bytes_view(self, offset_bytes: int, nbytes: int) -> torch.Tensor:
        return self.buffer.narrow(0, offset_bytes, nbytes)

    def typed_view(
        self, offset_bytes: int, nbytes: int, dtype: torch.dtype, shape: torch.Size
    ) -> torch.Tensor:
        """A tensor of ``dtype``/``shape`` aliasing ``nbytes`` of the arena at ``offset_bytes``.

        The offset must be aligned to the dtype's size (layouts align to 256 bytes).
        """
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=self.device)
        return self.bytes_view(offset_bytes, nbytes).view(dtype).view(shape)

    def copy_in(self, copies: list[tuple[int, torch.Tensor]]) -> None:
        """Copy host ``uint8`` tensors to arena offsets; returns when the bytes are in place.

        On CUDA the copies run on this device's copy stream (pinned source, non-blocking),
        after any work already queued on the compute stream, and the call waits for them:
        the caller marks the service resident only after this returns.
        """
        if self.copy_stream is None:
            for offset, source in copies:
                self.bytes_view(offset, source.numel()).copy_(source)
            return
        compute = torch.cuda.current_stream(self.device)
        self.copy_stream.wait_stream(compute)
        with torch.cuda.stream(self.copy_stream):
            for offset, source in copies:
                self.bytes_view(offset, source.numel()).copy_(source, non_blocking=True)
        self.copy_stream.synchronize()

    def copy_within(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy ``(source_offset, target_offset, nbytes)`` inside the arena, in list order.

        Order matters: a later target may overwrite an earlier source (compaction plans are
        built that way), so on CUDA all copies go on the one copy stream, after the work
        queued on the compute stream, and the call returns when they are done.
        """
        if self.copy_stream is None:
            for source, target, nbytes in copies:
                self.bytes_view(target, nbytes).copy_(self.bytes_view(source, nbytes))
            return
        compute = torch.cuda.current_stream(self.device)
        self.copy_stream.wait_stream(compute)
        with torch.cuda.stream(self.copy_stream):
            for source, target, nbytes in copies:
                self.bytes_view(target, nbytes).copy_(
                    self.bytes_view(source, nbytes), non_blocking=True
                )
        self.copy_stream.synchronize()

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Drop the arena tensor; its memory goes back to torch (and on CUDA, empty_cache)."""
        self.synchronize()
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        if self.is_cuda:
            torch.cuda.empty_cache()
