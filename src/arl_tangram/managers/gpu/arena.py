"""Shell: one pre-allocated arena tensor per device, carved into typed views.

The arena is a single ``uint8`` tensor of the device's budget, allocated once (CUDA:
``torch.empty`` on the GPU; CPU: host memory, touched once so its pages are really committed
and the first swap-in does not pay page faults). ``ExtentModel`` decides offsets (the manager
calls it under its lock); this module turns ``(offset, dtype, shape)`` into views and copies
bytes in (host -> arena) and down (arena -> arena, for compaction). The copy methods touch
only bytes their caller reserved, so they run without any lock.

Copies and forward passes share a CPU device's cores and memory bus. There a copy runs on
the device's copy thread at a lower CPU priority (``copier.py``), in slices, and before each
slice it yields to forward passes running on the device (replicas count them:
``run_started``/``run_ended``), for at most as long as it has copied so far: a resident
replica's calls keep their latency during swaps, and a swap under back-to-back runs takes at
most about twice its copy time. (torch's ``copy_`` releases the GIL, so the slices are not
there for the GIL.) On CUDA the copy runs on the copy engine, beside compute; the waiting
thread sleeps on a blocking event instead of spinning on a core.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from arl_tangram.managers.gpu.copier import Copier
from arl_tangram.managers.gpu.devices import DeviceSpec
from arl_tangram.managers.gpu.extents import ExtentModel

_MIN_PAUSE_S = 0.005  # a copy may always wait this long for runs, even before its first slice


class DeviceArena:
    """The arena of one device and its extent accounting.

    ``copy_slice_bytes``: slice of a copy on a CPU device; ``yield_to_runs``: whether copies
    wait for forward passes on this device (``None``: on CPU devices only); ``copy_nice``:
    how much lower the CPU priority of a CPU device's copy thread is (0: copies run in the
    caller's thread).
    """

    def __init__(
        self,
        spec: DeviceSpec,
        granule_bytes: int,
        copy_slice_bytes: int = 32 << 20,
        yield_to_runs: bool | None = None,
        copy_nice: int = 10,
    ) -> None:
        self.spec = spec
        self.device = torch.device(spec.torch_device)
        self.extents = ExtentModel(spec.mem_bytes, granule_bytes)
        self.buffer = torch.empty(
            self.extents.capacity_bytes, dtype=torch.uint8, device=self.device
        )
        if spec.kind == "cpu":
            self.buffer.zero_()  # commit the pages now, not during the first swap-in
        self.copy_stream: Any = torch.cuda.Stream(self.device) if spec.kind == "cuda" else None
        self.copy_slice_bytes = max(1, copy_slice_bytes)
        self.yield_to_runs = spec.kind == "cpu" if yield_to_runs is None else yield_to_runs
        self._runs = threading.Condition()
        self.num_runs = 0  # forward passes in flight on this device
        self.copy_paused_s = 0.0  # time copies spent waiting for runs (status; approximate)
        self.copier = (
            Copier(f"arl-tangram-copy-{spec.device_id}", copy_nice)
            if spec.kind == "cpu" and copy_nice > 0
            else None
        )
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

    def run_started(self) -> None:
        """A forward pass on this device began (``Replica.enter``)."""
        with self._runs:
            self.num_runs += 1

    def run_ended(self) -> None:
        with self._runs:
            self.num_runs -= 1
            if self.num_runs == 0:
                self._runs.notify_all()

    def copy_in(self, offset_bytes: int, source: torch.Tensor) -> None:
        """Copy a host ``uint8`` tensor to ``offset``; returns when the bytes are in place.

        On CUDA the copy runs on this device's copy stream (pinned source, non-blocking)
        after the work queued on the compute stream, and the call sleeps until it is done.
        On a CPU device it runs in slices that yield to forward passes (module docstring).
        """
        if source.numel() == 0:
            return
        target = self.bytes_view(offset_bytes, source.numel())
        if self.copy_stream is None:
            self._on_copier(lambda: self._copy_sliced([(target, source)]))
            return
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            target.copy_(source, non_blocking=True)
        self._wait_copy_stream()

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
        pieces = [
            (self.bytes_view(target_bytes + done, size), self.bytes_view(source_bytes + done, size))
            for done in range(0, nbytes, step)
            for size in [min(step, nbytes - done)]
        ]
        stream = self.copy_stream
        if stream is None:
            self._on_copier(lambda: self._copy_sliced(pieces))
            return
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for target, source in pieces:
                target.copy_(source, non_blocking=True)
        self._wait_copy_stream()

    def _on_copier(self, copy: Callable[[], None]) -> None:
        if self.copier is None:
            copy()
        else:
            self.copier.run(copy)

    def _copy_sliced(self, pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """CPU device: copy ``(target, source)`` pieces in order, in slices, yielding to runs."""
        copied_s = paused_s = 0.0
        for target, source in pieces:
            for start in range(0, source.numel(), self.copy_slice_bytes):
                if self.yield_to_runs and self.num_runs:
                    paused_s += self._wait_for_runs(max(_MIN_PAUSE_S, copied_s) - paused_s)
                size = min(self.copy_slice_bytes, source.numel() - start)
                started = time.perf_counter()
                target.narrow(0, start, size).copy_(source.narrow(0, start, size))
                copied_s += time.perf_counter() - started
        self.copy_paused_s += paused_s

    def _wait_for_runs(self, budget_s: float) -> float:
        """Wait until no forward pass runs here, for at most ``budget_s``; returns the wait."""
        if budget_s <= 0:
            return 0.0
        started = time.perf_counter()
        with self._runs:
            self._runs.wait_for(lambda: self.num_runs == 0, budget_s)
        return time.perf_counter() - started

    def _wait_copy_stream(self) -> None:
        """Sleep until the copy stream is done (a blocking event: no core spins meanwhile)."""
        done = torch.cuda.Event(blocking=True)
        done.record(self.copy_stream)
        done.synchronize()

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Stop the copy thread, drop the arena tensor; on CUDA its memory goes back to the
        driver (empty_cache). A copy still running keeps its views (and so the memory) alive
        until it ends."""
        if self.copier is not None:
            self.copier.close(timeout_s=5.0)  # joined: see ``copier._LIVE``
        self.synchronize()
        self.buffer = torch.empty(0, dtype=torch.uint8, device=self.device)
        if self.is_cuda:
            torch.cuda.empty_cache()
