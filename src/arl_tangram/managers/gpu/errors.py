"""Shell: the errors the GPU manager raises, one class per outcome a caller can act on.

Every error carries a message that names the service, field or device involved, so an API
face can map it to a 4xx/5xx without parsing text: ``InvalidRequestError`` and
``UnknownServiceError`` are the caller's fault, ``NeverFitsError`` is a rejection at
registration, the rest are infrastructure outcomes.
"""

from __future__ import annotations


class GpuManagerError(Exception):
    """Base class of everything the GPU manager raises on purpose."""


class UnknownServiceError(GpuManagerError, KeyError):
    """A call or an eviction named a service that was never registered."""

    def __init__(self, service: str, known: list[str]) -> None:
        self.service = service
        shown = ", ".join(sorted(known)) or "none"
        super().__init__(f"unknown service {service!r}; registered services: {shown}")

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0])


class InvalidRequestError(GpuManagerError, ValueError):
    """A request does not satisfy its handler's schema; names the field and the rule."""

    def __init__(self, field: str, rule: str, service: str | None = None) -> None:
        self.field = field
        self.rule = rule
        where = f" for service {service!r}" if service else ""
        super().__init__(f"invalid request{where}: field {field!r} {rule}")


class DuplicateServiceError(GpuManagerError, ValueError):
    """A registration reused a service name."""


class NeverFitsError(GpuManagerError):
    """A service needs more memory or devices than the node could ever give it."""


class ServiceFailedError(GpuManagerError):
    """The service failed to initialise; the cause is kept and repeated on every call."""

    def __init__(self, service: str, cause: str) -> None:
        self.service = service
        self.cause = cause
        super().__init__(f"service {service!r} failed to load: {cause}")


class DeviceBusyError(GpuManagerError):
    """No space could be made because every resident service stayed in use until the timeout."""


class DeviceOutOfMemoryError(GpuManagerError):
    """A single request ran out of device memory even alone, after eviction and batch splitting."""


class ServiceRuntimeError(GpuManagerError):
    """The service's forward pass raised; the service stays registered and keeps serving."""


class ManagerClosedError(GpuManagerError):
    """The manager was closed; no further calls are accepted."""


class CallCancelledError(ManagerClosedError):
    """A call (run, load, evict) was in progress or waiting when the manager closed."""


class UnknownReplicaError(GpuManagerError, KeyError):
    """A run or an eviction named a replica id that was never loaded."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        super().__init__(f"unknown replica {replica_id!r}: no load() used this id")

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateReplicaError(GpuManagerError, ValueError):
    """``load`` reused the id of a replica that is still loaded."""


class ReplicaEvictedError(GpuManagerError):
    """A run named a replica that was evicted (or is being evicted)."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        super().__init__(f"replica {replica_id!r} was evicted; runs need a loaded replica")


class ReplicaFailedError(GpuManagerError):
    """The replica's load or a relocation of it failed; it serves nothing."""

    def __init__(self, replica_id: str, cause: str) -> None:
        self.replica_id = replica_id
        super().__init__(f"replica {replica_id!r} failed: {cause}")


class InsufficientDeviceMemoryError(GpuManagerError):
    """``load`` found fewer free bytes on a device than the replica's shard needs there."""

    def __init__(self, device_id: str, need_bytes: int, free_bytes: int, replica_id: str) -> None:
        self.device_id = device_id
        self.need_bytes = need_bytes
        self.free_bytes = free_bytes
        super().__init__(
            f"replica {replica_id!r}: device {device_id} needs {need_bytes} bytes, "
            f"has {free_bytes} free; evict replicas there first"
        )
