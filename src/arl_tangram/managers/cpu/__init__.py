"""Shell: the CPU manager (stateful bubblewrap sandboxes in cgroups, Allocate-on-Execution).

Entry point: ``CpuManager``; see ``managers/cpu/manager.py`` for the calling contract.
"""

from arl_tangram.managers.cpu.config import CpuManagerConfig, SandboxSpec
from arl_tangram.managers.cpu.errors import (
    CgroupUnavailableError,
    CpuManagerError,
    InvalidRequestError,
    SandboxDeadError,
    SandboxNotFoundError,
)
from arl_tangram.managers.cpu.manager import CpuManager, Grant, SandboxInfo
from arl_tangram.managers.cpu.results import ExecResult, Outcome
from arl_tangram.managers.cpu.rootfs import UID_SHIFT, ImageRoot

__all__ = [
    "UID_SHIFT", "CgroupUnavailableError", "CpuManager", "CpuManagerConfig", "CpuManagerError", "ExecResult", "Grant",
    "ImageRoot", "InvalidRequestError", "Outcome", "SandboxDeadError", "SandboxInfo", "SandboxNotFoundError", "SandboxSpec",
]  # fmt: skip
