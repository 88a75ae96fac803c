"""Core: integer resource vectors over the resource kinds the system manages.

All amounts are integers in their natural unit so that accounting is exact:
CPU in millicores, memory in bytes, GPUs in whole devices, API quota in tokens
(concurrent requests held while an action runs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MILLICORES_PER_CORE = 1000


class ResourceKind(enum.Enum):
    CPU = "cpu"  # millicores
    MEM = "mem"  # bytes
    GPU = "gpu"  # devices
    QUOTA = "quota"  # concurrency tokens of an API provider

    @classmethod
    def parse(cls, name: str, field: str = "key") -> ResourceKind:
        from arl_tangram.core.errors import SpecError

        try:
            return cls(name)
        except ValueError:
            known = ", ".join(k.value for k in cls)
            raise SpecError(field, f"must be one of the resource kinds {known}", name) from None


@dataclass(frozen=True, slots=True)
class ResourceVector:
    """Amounts of each resource kind. Immutable; arithmetic returns new vectors."""

    cpu_millicores: int = 0
    mem_bytes: int = 0
    gpu_devices: int = 0
    quota_tokens: int = 0

    def __add__(self, other: ResourceVector) -> ResourceVector:
        return ResourceVector(
            self.cpu_millicores + other.cpu_millicores,
            self.mem_bytes + other.mem_bytes,
            self.gpu_devices + other.gpu_devices,
            self.quota_tokens + other.quota_tokens,
        )

    def __sub__(self, other: ResourceVector) -> ResourceVector:
        return ResourceVector(
            self.cpu_millicores - other.cpu_millicores,
            self.mem_bytes - other.mem_bytes,
            self.gpu_devices - other.gpu_devices,
            self.quota_tokens - other.quota_tokens,
        )

    def scale(self, factor: int) -> ResourceVector:
        return ResourceVector(
            self.cpu_millicores * factor,
            self.mem_bytes * factor,
            self.gpu_devices * factor,
            self.quota_tokens * factor,
        )

    def fits_in(self, capacity: ResourceVector) -> bool:
        return (
            self.cpu_millicores <= capacity.cpu_millicores
            and self.mem_bytes <= capacity.mem_bytes
            and self.gpu_devices <= capacity.gpu_devices
            and self.quota_tokens <= capacity.quota_tokens
        )

    def is_nonnegative(self) -> bool:
        return min(self.cpu_millicores, self.mem_bytes, self.gpu_devices, self.quota_tokens) >= 0

    def amount(self, kind: ResourceKind) -> int:
        return int(getattr(self, FIELD_OF_KIND[kind]))

    def is_zero(self) -> bool:
        return self == ZERO

    @classmethod
    def of(cls, kind: ResourceKind, amount: int) -> ResourceVector:
        return cls(**{FIELD_OF_KIND[kind]: amount})

    @classmethod
    def from_mapping(cls, demand: dict[str, int], field: str = "demand") -> ResourceVector:
        """Build from ``{"cpu": ..., "mem": ..., ...}``; unknown kinds raise ``SpecError``."""
        values = {}
        for name, amount in sorted(demand.items()):
            kind = ResourceKind.parse(name, f"{field}.{name}")
            values[FIELD_OF_KIND[kind]] = amount
        return cls(**values)


FIELD_OF_KIND = {
    ResourceKind.CPU: "cpu_millicores",
    ResourceKind.MEM: "mem_bytes",
    ResourceKind.GPU: "gpu_devices",
    ResourceKind.QUOTA: "quota_tokens",
}

ZERO = ResourceVector()
