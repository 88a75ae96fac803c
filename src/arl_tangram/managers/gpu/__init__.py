"""Shell: the GPU manager (Evict-on-Execution): devices, arenas, model services.

Importing this package imports torch; nothing in ``core`` or ``sim`` may import it.
Public API: ``GpuManager``, ``GpuManagerConfig``, ``DeviceSpec``, ``discover_devices``,
``cpu_devices``, ``LoadedModel`` and the errors in ``errors``.
"""

from arl_tangram.managers.gpu.devices import DeviceSpec, cpu_devices, discover_devices
from arl_tangram.managers.gpu.errors import (
    DeviceBusyError,
    DeviceOutOfMemoryError,
    DuplicateServiceError,
    GpuManagerError,
    InvalidRequestError,
    ManagerClosedError,
    NeverFitsError,
    ServiceFailedError,
    ServiceRuntimeError,
    UnknownServiceError,
)
from arl_tangram.managers.gpu.manager import GpuManager, GpuManagerConfig
from arl_tangram.managers.gpu.service import LoadedModel

__all__ = [
    "DeviceBusyError",
    "DeviceOutOfMemoryError",
    "DeviceSpec",
    "DuplicateServiceError",
    "GpuManager",
    "GpuManagerConfig",
    "GpuManagerError",
    "InvalidRequestError",
    "LoadedModel",
    "ManagerClosedError",
    "NeverFitsError",
    "ServiceFailedError",
    "ServiceRuntimeError",
    "UnknownServiceError",
    "cpu_devices",
    "discover_devices",
]
