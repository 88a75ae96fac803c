"""Shell: discover the devices the GPU manager may use, one code path for CUDA and CPU.

CUDA GPUs when torch sees them (each gets a memory budget: a fraction of its free memory, or
an explicit byte count); otherwise configured CPU devices (``cpu:0``, ``cpu:1``, ...), each
with an explicit memory budget. Everything above this module treats both the same way: a
``DeviceSpec`` with a torch device string and ``mem_bytes`` for its arena.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DeviceKind = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class DeviceSpec:
    """One device of the node: ``device_id`` is the name users see, ``torch_device`` what torch sees."""

    device_id: str
    torch_device: str
    kind: DeviceKind
    mem_bytes: int
    description: str = ""

    def __post_init__(self) -> None:
        if self.mem_bytes <= 0:
            raise ValueError(
                f"device {self.device_id}: mem_bytes must be positive, got {self.mem_bytes}"
            )


def cpu_devices(mem_bytes: Sequence[int]) -> list[DeviceSpec]:
    """CPU devices ``cpu:0 .. cpu:n-1`` with the given arena budgets (bytes)."""
    return [
        DeviceSpec(f"cpu:{i}", "cpu", "cpu", int(budget), "host memory arena")
        for i, budget in enumerate(mem_bytes)
    ]


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def cuda_devices(mem_fraction: float = 0.8, mem_bytes: int | None = None) -> list[DeviceSpec]:
    """Every visible CUDA device; budget = ``mem_bytes`` or ``mem_fraction`` of its free memory.

    The rest of the memory stays with torch's caching allocator for activations.
    """
    import torch

    if not 0.0 < mem_fraction <= 1.0:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    specs = []
    for index in range(torch.cuda.device_count()):
        free_bytes, _total = torch.cuda.mem_get_info(index)
        budget = int(mem_bytes) if mem_bytes is not None else int(free_bytes * mem_fraction)
        name = torch.cuda.get_device_name(index)
        specs.append(DeviceSpec(f"cuda:{index}", f"cuda:{index}", "cuda", budget, name))
    return specs


def discover_devices(
    cpu_mem_bytes: Sequence[int] = (1 << 30,),
    cuda_mem_fraction: float = 0.8,
    cuda_mem_bytes: int | None = None,
    use_cuda: bool | None = None,
) -> list[DeviceSpec]:
    """CUDA devices when available (or ``use_cuda=True``), else CPU devices with ``cpu_mem_bytes``.

    ``use_cuda=False`` forces CPU devices even on a GPU host (tests, benchmarks of the CPU path).
    """
    want_cuda = cuda_available() if use_cuda is None else use_cuda
    if want_cuda:
        if not cuda_available():
            raise RuntimeError("use_cuda=True but torch sees no CUDA device")
        return cuda_devices(cuda_mem_fraction, cuda_mem_bytes)
    return cpu_devices(cpu_mem_bytes)
