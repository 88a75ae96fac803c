"""Shell: one pre-allocated arena tensor per device, carved into typed views.

The arena is a single ``uint8`` tensor of the device's budget, allocated once (CUDA:
``torch.empty`` on the GPU; CPU: host memory, touched once so its pages are really committed
and the first swap-in does not pay page faults). ``ExtentModel`` decides offsets (the manager
calls it under its lock); this module turns ``(offset, dtype, shape)`` into views and copies
bytes in (host -> arena) and down (arena -> arena, for compaction). The copy methods touch
only bytes their caller reserved, so they run without any lock.
"""

from __future__ import annotations

from typing import Any

import torch

from arl_tangram.managers.gpu.devices import DeviceSpec
from arl_tangram.managers.gpu.extents import ExtentModel


class DeviceArena:
    """The arena of one device and its extent accounting."""

    def __init__(self, spec: DeviceSpec, granule_bytes: int) -> None:
        self.spec = spec
        self.device = torch.device(spec.torch_device)
        self.extents = ExtentModel(spec.mem_bytes, granule_bytes)
        self.buffer = torch.empty(
            self.extents.capacity_bytes, dtype=torch.uint8, device=self.device
        )
        if spec.kind == "cpu":
            self.buffer.zero_()  # commit the pages now, not during the first swap-in
        self.copy_stream: Any = torch.cuda.Stream(self.device) if spec.kind == "cuda" else None
        # Compaction counters (reported by ``GpuManager.status``), updated under the manager lock.
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
        """A tensor of ``dtype``/``shape`` aliasing ``nbytes`` of the arena at ``offset_bytes``."""
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=self.device)
        return self.bytes_view(offset_bytes, nbytes).view(dtype).view(shape)

    def copy_in(self, offset_bytes: int, source: torch.Tensor) -> None:
        """Copy a host ``uint8`` tensor to ``offset``; returns when the bytes are in place.

        On CUDA the copy runs on this device's copy stream (pinned source, non-blocking)
        after the work queued on the compute stream, and the call waits for it.
        """
        if source.numel() == 0:
            return
        target = self.bytes_view(offset_bytes, source.numel())
        if self.copy_stream is None:
            target.copy_(source)
            return
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            target.copy_(source, non_blocking=True)
        self.copy_stream.synchronize()

    def move_down(self, source_bytes: int, target_bytes: int, nbytes: int) -> None:
        """Copy ``nbytes`` from ``source`` to a lower ``target``; the ranges may overlap.

        Pieces no longer than the distance are copied lowest first, so a piece never
        overwrites bytes not yet read (on CUDA: in order on one stream).
        """
        if not 0 <= target_bytes < source_bytes:
            raise ValueError(
                f"move_down needs target < source, got {target_bytes} >= {source_bytes}"
            )
        step = source_bytes - target_bytes
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        for done in range(0, nbytes, step):
            size = min(step, nbytes - done)
            target = self.bytes_view(target_bytes + done, size)
            source = self.bytes_view(source_bytes + done, size)
            if stream is None:
                target.copy_(source)
            else:
                with torch.cuda.stream(stream):
                    target.copy_(source, non_blocking=True)
        if stream is not None:
            stream.synchronize()

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Drop the arena tensor; on CUDA its memory goes back to the driver (empty_cache)."""
        self.synchronize()
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        if self.is_cuda:
            torch.cuda.empty_cache()
