"""Shell: the ports of a node agent: what the runtime may ask of a node's managers.

A ``NodeAgent`` holds one object per port; the local backend fills them with the managers
themselves (``CpuManager``, ``GpuManager``, ``ApiManager`` satisfy these Protocols
structurally), a remote backend (``backends/ray``) with proxies that forward each call to
the node. Only what the runtime, the SDK's in-process transport and the embedded runtime
call is here: a method added to a caller must be added here and to every proxy.

Contracts are the managers' (see their docstrings): CPU and GPU calls block and are made on
worker threads; API calls are coroutines. A proxy raises on a call it cannot complete (the
node is gone) and never hangs past the node's loss being known.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # no torch, httpx or cgroup code at import
    from arl_tangram.managers.api.results import ApiRequest, ApiResult
    from arl_tangram.managers.cpu.config import SandboxSpec
    from arl_tangram.managers.cpu.preempt import RunHandle
    from arl_tangram.managers.cpu.results import ExecResult
    from arl_tangram.managers.gpu.service import ServiceInfo


class CpuPort(Protocol):
    """Sandboxes of one node (``managers.cpu.CpuManager``)."""

    def numa_cores(self) -> tuple[int, ...]: ...

    def create_sandbox(
        self, spec: SandboxSpec | None = None, *, sandbox_id: str | None = None
    ) -> str: ...

    def hold(
        self,
        sandbox_id: str,
        millicores: int,
        numa_millicores: Sequence[int] | None = None,
        *,
        limit: bool = True,
    ) -> None: ...

    def list_sandboxes(self) -> list[str]: ...

    def destroy_sandbox(self, sandbox_id: str) -> None: ...

    def exec(
        self, sandbox_id: str, command: str | Sequence[str], *, millicores: int | None = None,
        numa_millicores: Sequence[int] | None = None, dop: int | None = None, cores: int | None = None,
        stdin: bytes | str | None = None, env: Mapping[str, str] | None = None, cwd: str | None = None,
        timeout_s: float = 60.0, max_output_bytes: int | None = None, cancel: threading.Event | None = None,
        background: bool = False, on_output: Callable[[str, bytes], None] | None = None,
        handle: RunHandle | None = None,
        mem_limit_bytes: int | None = None, on_memory_paused: Callable[[int], None] | None = None,
    ) -> ExecResult: ...  # fmt: skip

    def grow_memory(self, sandbox_id: str, limit_bytes: int) -> bool: ...

    def oom_kill(self, sandbox_id: str) -> bool: ...

    def run_in_session(
        self, session_id: str, command: str, *, millicores: int | None = None, numa_millicores: Sequence[int] | None = None,
        dop: int | None = None, cores: int | None = None, timeout_s: float = 60.0, max_output_bytes: int | None = None,
        cancel: threading.Event | None = None,
    ) -> ExecResult: ...  # fmt: skip

    def write_file(
        self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644
    ) -> None: ...

    def read_file(self, sandbox_id: str, path: str, max_bytes: int | None = None) -> bytes: ...

    def empty_dirs(self, sandbox_id: str, paths: Sequence[str]) -> tuple[bool, str]: ...

    def open_session(
        self, sandbox_id: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> str: ...

    def close_session(self, session_id: str) -> None: ...

    def close(self) -> None: ...


class LayerLike(Protocol):
    """A layer of the node's image store (``managers.images.model.LayerRecord``)."""

    @property
    def digest(self) -> str: ...
    @property
    def unpacked_bytes(self) -> int: ...
    @property
    def path(self) -> Path: ...


class ImageConfigLike(Protocol):
    """An image's config as the store resolved it (``managers.images.model.ImageConfig``)."""

    @property
    def env(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def working_dir(self) -> str: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...


class ImageRecordLike(Protocol):
    """An image of the node's store (``managers.images.model.ImageRecord``)."""

    @property
    def image_id(self) -> str: ...
    @property
    def references(self) -> tuple[str, ...]: ...
    @property
    def layers(self) -> Sequence[LayerLike]: ...
    @property
    def config(self) -> ImageConfigLike: ...
    @property
    def size_bytes(self) -> int: ...


class ImagePort(Protocol):
    """The node's image store (``managers.images.store.ImageStore``): every call blocks
    (registry I/O, unpacking), so callers run it on worker threads."""

    def pull(self, reference: str, progress: Callable[[Any], None] | None = None) -> ImageRecordLike: ...

    def import_path(self, path: Path, reference: str | None = None) -> ImageRecordLike: ...

    def lookup(self, reference_or_id: str) -> ImageRecordLike | None: ...

    def list_images(self) -> Sequence[ImageRecordLike]: ...

    def remove(self, reference_or_id: str) -> None: ...

    def layer_bytes(self) -> dict[str, int]: ...

    def pin(self, image_id: str, holder_id: str) -> None: ...

    def unpin(self, holder_id: str) -> None: ...

    def gc(self) -> list[str]: ...


class GpuPort(Protocol):
    """Devices and model services of one node (``managers.gpu.GpuManager``)."""

    def device_capacity_bytes(self) -> list[int]: ...

    def service_info(self, name: str) -> ServiceInfo: ...

    def footprint_bytes(self, service: str, num_devices: int) -> int: ...

    def register_folder(self, name: str, path: str | Path, handler: str, kv: Any = None) -> ServiceInfo: ...

    def register_module(self, name: str, factory: Any, handler: str, kv: Any = None) -> ServiceInfo: ...

    def load(self, replica_id: str, service: str, devices: Sequence[int]) -> float: ...

    def evict(self, replica_id: str) -> None: ...

    def run(
        self, replica_id: str, request: Any, on_event: Callable[[dict[str, Any]], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any]: ...  # fmt: skip

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ApiPort(Protocol):
    """Quota-managed outbound API calls (``managers.api.ApiManager``)."""

    async def call(
        self,
        provider: str,
        request: ApiRequest,
        *,
        tokens: int | None = None,
        timeout_s: float = 60,
    ) -> ApiResult: ...

    def status(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
