"""Shell: ``GpuManager``, the GPU manager of one node (Evict-on-Execution).

Who calls: the node agent (later) and benchmarks/tests directly. Services are registered
once (built on the host, weights kept in a host backup, rejected at once if they could never
fit); ``call`` validates a request, batches it with concurrent requests to the same service,
and runs the batch in a worker thread: the service is swapped in if it is not resident
(relocating idle services inside the arena, then evicting least-recently-used unpinned
services, when its blocks do not fit), pinned while
it runs, and stays resident afterwards until space is needed.

Thread-safety: one condition variable guards all accounting; forward passes run outside
it. ``call`` is the asyncio face; ``call_sync`` the blocking one (same path, batch of one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arl_tangram.managers.gpu import models
from arl_tangram.managers.gpu.batching import MicroBatcher
from arl_tangram.managers.gpu.devices import DeviceSpec, discover_devices
from arl_tangram.managers.gpu.errors import (
    DeviceBusyError,
    DeviceOutOfMemoryError,
    DuplicateServiceError,
    InvalidRequestError,
    ManagerClosedError,
    NeverFitsError,
    ServiceFailedError,
    ServiceRuntimeError,
    UnknownServiceError,
)
from arl_tangram.managers.gpu.handlers import HANDLERS
from arl_tangram.managers.gpu.residency import Residency
from arl_tangram.managers.gpu.service import LoadedModel, ModelService, ServiceState
from arl_tangram.managers.gpu.status import (
    DeviceStatus,
    ServiceStatus,
    device_status,
    service_status,
)

Factory = Callable[[], "torch.nn.Module | LoadedModel"]
COMPACTION_MODES = ("off", "on_demand", "eager")


@dataclass(frozen=True)
class GpuManagerConfig:
    """Knobs of the manager. ``None`` means: pick by device kind (documented per field)."""

    min_block_bytes: int | None = None  # buddy granule: 64 KiB on CPU devices, 2 MiB on CUDA
    align_bytes: int = 256  # start of every tensor inside a block
    batch_window_s: float = 0.002  # how long a batch waits for company
    max_batch_size: int = 32
    num_workers: int | None = None  # forward-pass threads: one per CUDA device, else 1
    acquire_timeout_s: float = 60.0  # wait for pinned services to finish before DeviceBusyError
    torch_num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    # Relocating idle services inside an arena (``compaction.py``): "off"; "on_demand" = when
    # a service does not fit, relocate (fewest moves) before evicting anything; "eager" =
    # on_demand plus a full compaction of the devices an eviction freed. None: "eager" on
    # CUDA (an on-device copy is far cheaper than the host -> device swap-in it saves),
    # "on_demand" on CPU devices (there both copies run at memory bandwidth).
    compaction: str | None = None


class GpuManager:
    """Model services on the devices of one node. Use as a context manager or call ``close``."""

    def __init__(
        self, devices: Sequence[DeviceSpec] | None = None, config: GpuManagerConfig | None = None
    ) -> None:
        self.config = config or GpuManagerConfig()
        self.devices = list(devices) if devices is not None else discover_devices()
        if not self.devices:
            raise ValueError("GpuManager needs at least one device")
        on_cuda = any(d.kind == "cuda" for d in self.devices)
        self._pin_host = on_cuda and torch.cuda.is_available()
        if self.config.torch_num_threads:
            torch.set_num_threads(self.config.torch_num_threads)
        min_block = self.config.min_block_bytes or ((2 << 20) if on_cuda else (64 << 10))
        self.compaction = self.config.compaction or ("eager" if on_cuda else "on_demand")
        if self.compaction not in COMPACTION_MODES:
            raise ValueError(
                f"compaction must be one of {COMPACTION_MODES}, got {self.compaction!r}"
            )
        self._residency = Residency(self.devices, min_block)
        self._services: dict[str, ModelService] = {}
        self._cond = threading.Condition()
        self._closed = False
        workers = self.config.num_workers or (sum(d.kind == "cuda" for d in self.devices) or 1)
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="arl-tangram-gpu")
        self._batcher = MicroBatcher(
            self._execute, self._executor, self.config.batch_window_s, self.config.max_batch_size
        )

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> GpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting calls, wait for running batches, free the arenas. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._executor.shutdown(wait=True)
        with self._cond:
            for service in self._services.values():
                if service.state is ServiceState.RESIDENT:
                    self._residency.evict(service)
            self._residency.close()

    async def aclose(self) -> None:
        """Drain batches started from the running loop, then ``close`` (in a thread)."""
        import asyncio

        await self._batcher.drain()
        await asyncio.to_thread(self.close)

    # -- registration --------------------------------------------------------------------
    def register_module(
        self, name: str, factory: Factory, kind: str, num_devices: int = 1
    ) -> ServiceStatus:
        """Register a service built by ``factory`` (an ``nn.Module`` or a ``LoadedModel``).

        The factory runs once, now, in the caller's thread. A factory that raises leaves the
        service registered as ``failed`` with its error (the returned status says so); a
        service that could never fit raises ``NeverFitsError`` and is not registered.
        """
        return self._register(name, lambda: _as_loaded(factory()), kind, num_devices)

    def register_folder(
        self, name: str, path: str | Path, kind: str, num_devices: int = 1
    ) -> ServiceStatus:
        """Register a local model folder (safetensors + config.json, optional tokenizer)."""
        folder = Path(path)
        hint = models.folder_weight_bytes(folder) if folder.is_dir() else 0
        largest = max(a.allocator.capacity_bytes for a in self._residency.arenas)
        if hint > largest * num_devices:
            raise NeverFitsError(
                f"service {name!r}: {folder} holds {hint} bytes of weights; {num_devices} device(s) "
                f"of at most {largest} bytes cannot hold it"
            )
        return self._register(name, lambda: models.load_folder(folder, kind), kind, num_devices)

    def _register(
        self, name: str, loader: Callable[[], LoadedModel], kind: str, num_devices: int
    ) -> ServiceStatus:
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("name", "must be a non-empty string")
        if kind not in HANDLERS:
            raise InvalidRequestError("kind", f"must be one of {sorted(HANDLERS)}, got {kind!r}")
        service = ModelService(name, kind, num_devices)
        with self._cond:
            self._check_open()
            if name in self._services:
                raise DuplicateServiceError(f"service {name!r} is already registered")
            if num_devices not in self._residency.chunks.level_sizes:
                raise NeverFitsError(
                    f"service {name!r} needs {num_devices} devices; this node offers chunks of "
                    f"{list(self._residency.chunks.level_sizes)} devices"
                )
            self._services[name] = service  # reserve the name while loading
        try:
            model = loader()
            block = self._residency.min_block_bytes
            service.adopt(model, block, self.config.align_bytes, self._pin_host)
        except Exception as exc:  # a broken model must not take the manager down
            with self._cond:
                service.error = f"{type(exc).__name__}: {exc}"
                service.model = None
                service.transition(ServiceState.FAILED)
                return service_status(service, self._residency)
        with self._cond:
            try:
                self._residency.check_fits_ever(service)
            except NeverFitsError:
                del self._services[name]
                raise
            service.transition(ServiceState.HOST)
            return service_status(service, self._residency)

    # -- calls ---------------------------------------------------------------------------
    async def call(self, service: str, request: Any) -> dict[str, Any]:
        """Run one request on ``service``; batched with concurrent requests to it."""
        parsed = self._parse(service, request)
        result: dict[str, Any] = await self._batcher.submit(service, parsed)
        return result

    def call_sync(self, service: str, request: Any) -> dict[str, Any]:
        """Blocking ``call`` in the caller's thread (a batch of one)."""
        parsed = self._parse(service, request)
        result = self._execute(service, [parsed])[0]
        if isinstance(result, BaseException):
            raise result
        return dict(result)

    def _parse(self, name: str, request: Any) -> Any:
        service = self._get(name)
        if service.state is ServiceState.FAILED or service.model is None:
            raise ServiceFailedError(name, service.error or "still loading")
        return HANDLERS[service.kind].parse(request, service.model, name)

    def _get(self, name: str) -> ModelService:
        with self._cond:
            self._check_open()
            service = self._services.get(name)
            if service is None or service.state is ServiceState.LOADING:
                raise UnknownServiceError(name, list(self._services))
            return service

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("the GPU manager is closed")

    def _execute(self, name: str, items: list[Any]) -> list[Any]:
        """Worker-thread body: pin (swapping in as needed), run, unpin. One result per item."""
        service = self._get(name)
        self._acquire(service)
        try:
            with torch.inference_mode():
                return self._run_items(service, items)
        finally:
            with self._cond:
                service.in_use -= 1
                service.num_requests += len(items)
                self._cond.notify_all()

    def _run_items(self, service: ModelService, items: list[Any]) -> list[Any]:
        """Run a batch; out of memory splits it in halves, other errors isolate each request."""
        assert service.model is not None
        try:
            return HANDLERS[service.kind].run(service.model, items, service.input_device)
        except torch.OutOfMemoryError as exc:
            if service.input_device.type == "cuda":
                torch.cuda.empty_cache()
            if len(items) == 1:
                return [
                    DeviceOutOfMemoryError(
                        f"service {service.name!r}: out of memory on a single request: {exc}"
                    )
                ]
            middle = len(items) // 2
            return self._run_items(service, items[:middle]) + self._run_items(
                service, items[middle:]
            )
        except Exception as exc:
            if len(items) > 1:
                return [result for item in items for result in self._run_items(service, [item])]
            return [
                ServiceRuntimeError(f"service {service.name!r} raised {type(exc).__name__}: {exc}")
            ]

    def _acquire(self, service: ModelService) -> None:
        """Make ``service`` resident and pin it; evicts LRU unpinned services to make room."""
        deadline = time.monotonic() + self.config.acquire_timeout_s
        with self._cond:
            while True:
                self._check_open()
                if service.state is ServiceState.FAILED:
                    raise ServiceFailedError(service.name, service.error or "unknown")
                if service.state is ServiceState.RESIDENT:
                    break
                resident = self._resident()
                placement = self._residency.try_place(service)
                relocate = placement is None and self.compaction != "off"
                if relocate and self._residency.make_room(service, resident):  # before evicting
                    placement = self._residency.try_place(service)
                if placement is not None:
                    self._residency.swap_in(service, placement)
                    break
                victim = self._residency.pick_victim(service, resident)
                if victim is not None:
                    devices = [device for device, _ in victim.placement or []]
                    self._residency.evict(victim)
                    if self.compaction == "eager":
                        self._residency.compact(devices, self._resident())
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._cond.wait(remaining):
                    raise DeviceBusyError(
                        f"service {service.name!r}: no room after {self.config.acquire_timeout_s} s; "
                        "every resident service stayed in use"
                    )
            service.in_use += 1
            self._residency.touch(service)

    def _resident(self) -> list[ModelService]:
        """Resident services sorted by name (determinism). Call with the lock held."""
        return sorted(
            (s for s in self._services.values() if s.state is ServiceState.RESIDENT),
            key=lambda s: s.name,
        )

    # -- operations ----------------------------------------------------------------------
    def compact(self) -> None:
        """Fully compact every device now (idle services only; in-use ones are not moved)."""
        with self._cond:
            self._check_open()
            self._residency.compact(range(len(self._residency.arenas)), self._resident())

    def prefetch(self, name: str) -> float:
        """Make ``name`` resident now (evicting as needed); returns the swap-in seconds (0 if resident)."""
        service = self._get(name)
        before = service.num_swap_ins
        self._acquire(service)
        with self._cond:
            service.in_use -= 1
            self._cond.notify_all()
            return service.last_swap_in_s if service.num_swap_ins > before else 0.0

    def evict(self, name: str) -> bool:
        """Evict ``name`` if resident and not in use; returns whether it was evicted."""
        service = self._get(name)
        with self._cond:
            if service.state is not ServiceState.RESIDENT or service.in_use:
                return False
            self._residency.evict(service)
            return True

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: devices (capacity, free, largest block) and services."""
        with self._cond:
            devices: list[DeviceStatus] = [
                device_status(i, arena, self._services.values())
                for i, arena in enumerate(self._residency.arenas)
            ]
            services: list[ServiceStatus] = [
                service_status(s, self._residency) for _, s in sorted(self._services.items())
            ]
        return {
            "devices": [asdict(d) for d in devices],
            "services": {s.name: asdict(s) for s in services},
        }

    def check_invariants(self) -> None:
        """Allocator and residency accounting agree (tests call this in teardown)."""
        with self._cond:
            for arena in self._residency.arenas:
                arena.allocator.check_invariants()
            self._residency.chunks.check_invariants()
            for i, arena in enumerate(self._residency.arenas):
                held = sum(
                    block.size_bytes
                    for s in self._services.values()
                    for device, blocks in (s.placement or [])
                    if device == i
                    for block in blocks
                )
                assert held == arena.allocator.used_bytes, (
                    f"device {i}: services hold {held}, allocator says {arena.allocator.used_bytes}"
                )


def _as_loaded(built: Any) -> LoadedModel:
    if isinstance(built, LoadedModel):
        return built
    if not isinstance(built, torch.nn.Module):
        raise TypeError(
            f"factory must return a torch.nn.Module or LoadedModel, got {type(built).__name__}"
        )
    config = getattr(built, "config", None)
    vocab = getattr(config, "vocab_size", None)
    max_length = getattr(config, "max_position_embeddings", None) or 512
    return LoadedModel(
        module=built, vocab_size=int(vocab) if vocab else None, max_length=int(max_length)
    )
