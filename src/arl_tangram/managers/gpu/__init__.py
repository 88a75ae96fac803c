"""Shell: the GPU manager (Evict-on-Execution mechanism): devices, arenas, model replicas.

Importing this package imports torch; nothing in ``core`` or ``sim`` may import it.
Public API: ``GpuManager`` (mechanism addressed by replica ids: ``load``, ``evict``,
``run``, ``run_async``), ``GpuManagerConfig``, ``ServiceInfo``, ``DeviceSpec``,
``discover_devices``, ``cpu_devices``, ``LoadedModel``, the errors in ``errors``, and
``StandaloneGpuManager`` (a name-addressed convenience wrapper with its own LRU policy, for
benchmarks and scripts; never on the live path).
"""

from arl_tangram.managers.gpu.devices import DeviceSpec, cpu_devices, discover_devices
from arl_tangram.managers.gpu.errors import (
    CallCancelledError,
    DeviceBusyError,
    DeviceOutOfMemoryError,
    DuplicateReplicaError,
    DuplicateServiceError,
    GpuManagerError,
    InsufficientDeviceMemoryError,
    InvalidRequestError,
    ManagerClosedError,
    NeverFitsError,
    ReplicaEvictedError,
    ReplicaFailedError,
    ServiceFailedError,
    ServiceRuntimeError,
    UnknownReplicaError,
    UnknownServiceError,
)
from arl_tangram.managers.gpu.manager import GpuManager, GpuManagerConfig
from arl_tangram.managers.gpu.service import LoadedModel, ServiceInfo
from arl_tangram.managers.gpu.standalone import StandaloneGpuManager

__all__ = [
    "CallCancelledError",
    "DeviceBusyError",
    "DeviceOutOfMemoryError",
    "DeviceSpec",
    "DuplicateReplicaError",
    "DuplicateServiceError",
    "GpuManager",
    "GpuManagerConfig",
    "GpuManagerError",
    "InsufficientDeviceMemoryError",
    "InvalidRequestError",
    "LoadedModel",
    "ManagerClosedError",
    "NeverFitsError",
    "ReplicaEvictedError",
    "ReplicaFailedError",
    "ServiceFailedError",
    "ServiceInfo",
    "ServiceRuntimeError",
    "StandaloneGpuManager",
    "UnknownReplicaError",
    "UnknownServiceError",
    "cpu_devices",
    "discover_devices",
]
