"""Shell: ``GpuManager``, the GPU mechanism of one node, addressed by the core's replica ids.

Who calls: the node agent (carrying out the core's ``LoadService``/``EvictService``
decisions and running actions), benchmarks and tests. The manager keeps no policy: it never
picks devices, never evicts on its own initiative, never decides when to compact for
performance. It obeys:
- ``register_module``/``register_folder``: build a service once, keep one host copy.
- ``load(replica_id, service, devices)``: a device copy split by module over exactly
  ``devices``; slides idle replicas down (compaction) when the free bytes are fragmented.
- ``evict(replica_id)``: drain that replica's runs, release exactly its memory.
- ``run(replica_id, request)`` / ``run_async``: a batched forward pass on that replica;
  ``generate`` services decode in that replica's continuous batch (``decoding.py``), their
  KV cache reserved beside the weights (``kv.py``).

Concurrency: one condition variable (``_lock``) guards the registry, the replica table and
the extent accounting, and is held only for bookkeeping. Copies (swap-in, relocation), file
reads, tokenisation and forward passes run outside it: reserve under the lock, work outside,
publish under it. Each replica has its own state machine and lock (``replica.py``). The
asyncio faces hand everything to a bounded thread pool.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arl_tangram.managers.gpu import models
from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.batching import ThreadBatcher
from arl_tangram.managers.gpu.decoding import EventSink
from arl_tangram.managers.gpu.devices import DeviceSpec, discover_devices
from arl_tangram.managers.gpu.errors import (
    CallCancelledError,
    DuplicateReplicaError,
    DuplicateServiceError,
    InvalidRequestError,
    ManagerClosedError,
    NeverFitsError,
    ServiceFailedError,
    UnknownReplicaError,
    UnknownServiceError,
)
from arl_tangram.managers.gpu.execution import run_items
from arl_tangram.managers.gpu.generation import ReplicaDecoders
from arl_tangram.managers.gpu.handlers import HANDLERS
from arl_tangram.managers.gpu.kv import KvCacheConfig, size_kv_cache
from arl_tangram.managers.gpu.relocation import Relocator
from arl_tangram.managers.gpu.replica import Replica, ReplicaState, prune_tombstones
from arl_tangram.managers.gpu.routing import device_context
from arl_tangram.managers.gpu.service import LoadedModel, ModelService, ServiceInfo, as_loaded
from arl_tangram.managers.gpu.status import check_extents, manager_status

Factory = Callable[[], "torch.nn.Module | LoadedModel"]
_MAX_TOMBSTONES = 4096  # evicted/failed replica ids remembered for clear errors


@dataclass(frozen=True)
class GpuManagerConfig:
    """Knobs of the manager. ``None`` means: pick by device kind (documented per field)."""

    granule_bytes: int | None = None  # extent granule: 64 KiB on CPU devices, 2 MiB on CUDA
    align_bytes: int = 256  # start of every tensor inside a shard
    batch_window_s: float = 0.002  # how long a batch waits for company
    max_batch_size: int = 32
    num_async_threads: int = 64  # threads behind run_async/load_async/evict_async
    wait_timeout_s: float = 60.0  # bound of every wait (runs draining, loads in progress)
    close_timeout_s: float = 30.0  # how long close() waits for forward passes in flight
    torch_num_threads: int | None = None  # torch intra-op threads; None leaves torch's default
    copy_slice_bytes: int = 32 << 20  # CPU devices: a copy yields to runs between slices
    copy_yields_to_runs: bool | None = None  # None: on CPU devices only (``arena.py``)
    copy_nice: int = 10  # CPU devices: copy thread's nice above the caller's (``copier.py``)


class GpuManager:
    """Model replicas on the devices of one node. Use as a context manager or call ``close``."""

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
        granule = self.config.granule_bytes or ((2 << 20) if on_cuda else (64 << 10))
        self._arenas = [
            DeviceArena(
                spec,
                granule,
                self.config.copy_slice_bytes,
                self.config.copy_yields_to_runs,
                self.config.copy_nice,
            )
            for spec in self.devices
        ]
        self._lock = threading.Condition()
        self._closed = threading.Event()
        self._num_ops = 0
        self._services: dict[str, ModelService] = {}
        self._replicas: collections.OrderedDict[str, Replica] = collections.OrderedDict()
        self._batcher = ThreadBatcher(self.config.batch_window_s, self.config.max_batch_size)
        self._decoders = ReplicaDecoders(self._closed, self.config.wait_timeout_s)
        self._pool = ThreadPoolExecutor(
            self.config.num_async_threads, thread_name_prefix="arl-tangram-gpu"
        )
        self._relocator = Relocator(
            self._arenas, self._replicas, self._lock, self._closed, self.config.wait_timeout_s
        )

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> GpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End every call with ``CallCancelledError``, free the arenas. Idempotent, thread-safe.

        Waiting calls are woken and cancelled at once; forward passes and copies already
        running are waited for (up to ``close_timeout_s``; their memory stays alive while
        they hold it) and then report cancelled too.
        """
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self._lock.notify_all()
            replicas = list(self._replicas.values())
        for replica in replicas:
            with replica.cond:
                replica.cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + self.config.close_timeout_s
        with self._lock:
            while self._num_ops and time.monotonic() < deadline:
                self._lock.wait(0.05)
            for replica in replicas:
                self._release(replica)
                replica.end_on_close()
                replica.drop()  # not recycled: a forward may still be in it
            self._replicas.clear()
        for arena in self._arenas:
            arena.close()
        for service in self._services.values():
            service.release_host()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @contextlib.contextmanager
    def _op(self) -> Iterator[None]:
        """Count a public call so ``close`` can wait for it; refuse calls after close."""
        with self._lock:
            if self._closed.is_set():
                raise ManagerClosedError("the GPU manager is closed")
            self._num_ops += 1
        try:
            yield
        finally:
            with self._lock:
                self._num_ops -= 1
                self._lock.notify_all()

    # -- registration --------------------------------------------------------------------
    def register_module(
        self, name: str, factory: Factory, handler: str, kv: KvCacheConfig | None = None
    ) -> ServiceInfo:
        """Register a service built by ``factory`` (an ``nn.Module`` or a ``LoadedModel``).

        The factory runs once, now, in the caller's thread, outside every lock. A factory that
        raises leaves the service registered as ``failed`` with its error; a service that no
        device of the node could hold even split over all of them raises ``NeverFitsError``
        and is not registered. ``kv`` sizes a ``generate`` service's KV cache (``kv.py``).
        """
        return self._register(name, lambda: as_loaded(factory()), handler, kv)

    def register_folder(
        self, name: str, path: str | Path, handler: str, kv: KvCacheConfig | None = None
    ) -> ServiceInfo:
        """Register a local model folder (safetensors + config.json, optional tokenizer)."""
        folder = Path(path)
        hint = models.folder_weight_bytes(folder) if folder.is_dir() else 0
        if hint > sum(self.device_capacity_bytes()):
            raise NeverFitsError(
                f"service {name!r}: {folder} holds {hint} bytes of weights; all devices together "
                f"hold {sum(self.device_capacity_bytes())} bytes"
            )
        return self._register(name, lambda: models.load_folder(folder, handler), handler, kv)

    def _register(
        self, name: str, loader: Callable[[], LoadedModel], handler: str, kv: KvCacheConfig | None
    ) -> ServiceInfo:
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("name", "must be a non-empty string")
        if handler not in HANDLERS:
            raise InvalidRequestError(
                "handler", f"must be one of {sorted(HANDLERS)}, got {handler!r}"
            )
        service = ModelService(name, handler)
        with self._op(), self._lock:
            if name in self._services:
                raise DuplicateServiceError(f"service {name!r} is already registered")
            self._services[name] = service  # reserve the name; invisible until ready
        try:
            service.adopt(loader(), self._pin_host, self.config.align_bytes)
        except Exception as exc:  # a broken model must not take the manager down
            service.error = f"{type(exc).__name__}: {exc}"
            service.model = None
            return service.info()
        if handler == "generate":
            try:
                size_kv_cache(service, kv or KvCacheConfig())
            except InvalidRequestError:  # not a causal LM: refused, not registered
                with self._lock:
                    del self._services[name]
                service.release_host()
                raise
        footprint = self.footprint_bytes(name, len(self._arenas))
        if footprint > max(self.device_capacity_bytes()):
            with self._lock:
                del self._services[name]
            service.release_host()
            raise NeverFitsError(
                f"service {name!r} needs {footprint} bytes on its most loaded device even split over "
                f"all {len(self._arenas)} device(s); the largest device holds {max(self.device_capacity_bytes())} bytes"
            )
        return service.info()

    # -- queries -------------------------------------------------------------------------
    def services(self) -> list[str]:
        """Names of registered services (failed ones included), sorted."""
        with self._lock:
            return sorted(n for n, s in self._services.items() if s.model is not None or s.error)

    def service_info(self, name: str) -> ServiceInfo:
        return self._service(name, ready=False).info()

    def device_capacity_bytes(self) -> list[int]:
        """Arena bytes per device index (what replicas can use in total)."""
        return [arena.extents.capacity_bytes for arena in self._arenas]

    def device_free_bytes(self) -> list[int]:
        with self._lock:
            return [arena.extents.free_bytes for arena in self._arenas]

    def footprint_bytes(self, service: str, num_devices: int) -> int:
        """Arena bytes one replica of ``service`` split over ``num_devices`` takes on its most
        loaded device (exactly what ``load`` reserves there, granule included; a generating
        replica's KV reservation sits on its home device, the first)."""
        if not isinstance(num_devices, int) or num_devices < 1:
            raise InvalidRequestError(
                "num_devices", f"must be a positive integer, got {num_devices!r}"
            )
        shards = self._service(service).shards(num_devices)
        granule = self._arenas[0].extents
        kv = self._service(service).kv_cache_bytes
        return max(granule.size_for(shard.nbytes + (kv if i == 0 else 0)) for i, shard in enumerate(shards))

    def replica_state(self, replica_id: str) -> str:
        return self._replica(replica_id).state.value

    def _service(self, name: str, ready: bool = True) -> ModelService:
        with self._lock:
            service = self._services.get(name)
            if service is None or (service.model is None and not service.error):
                known = [n for n, s in self._services.items() if s.model is not None or s.error]
                raise UnknownServiceError(name, known)
        if ready and service.model is None:
            raise ServiceFailedError(name, service.error or "failed")
        return service

    def _replica(self, replica_id: str) -> Replica:
        with self._lock:
            replica = self._replicas.get(replica_id)
        if replica is None:
            raise UnknownReplicaError(replica_id)
        return replica

    # -- load / evict --------------------------------------------------------------------
    def load(self, replica_id: str, service: str, devices: Sequence[int]) -> float:
        """Make a replica of ``service`` resident on exactly ``devices``; returns the copy seconds.

        Succeeds whenever each device has at least ``footprint_bytes(service, len(devices))``
        free bytes, relocating idle replicas down when the free bytes are fragmented. Never
        evicts: a device without enough free bytes raises ``InsufficientDeviceMemoryError``
        naming it. Ids are unique among loaded replicas (``DuplicateReplicaError``); the id of
        an evicted or failed replica may be reused. Runs submitted while it loads wait for it.
        """
        with self._op():
            indices = self._check_devices(devices)
            model = self._service(service)
            shards = model.shards(len(indices))
            replica = Replica(replica_id, model, indices[: len(shards)], shards)
            with self._lock:
                old = self._replicas.get(replica_id)
                if old is not None and old.state not in (ReplicaState.EVICTED, ReplicaState.FAILED):
                    raise DuplicateReplicaError(
                        f"replica {replica_id!r} is already {old.state.value}"
                    )
                self._replicas.pop(replica_id, None)
                self._replicas[replica_id] = replica
                prune_tombstones(self._replicas, _MAX_TOMBSTONES)
            try:
                deadline = time.monotonic() + self.config.wait_timeout_s
                for i, shard in enumerate(shards):
                    kv = model.kv_cache_bytes if i == 0 else 0  # the KV cache: home device
                    replica.extents[i] = self._relocator.reserve(
                        replica, replica.devices[i], shard.nbytes + kv, deadline
                    )
                started = time.perf_counter()
                replica.materialise(self._arenas)  # the heavy copy: no manager lock held
                with self._lock, replica.cond:
                    if self._closed.is_set():
                        raise CallCancelledError(
                            f"replica {replica_id!r}: the GPU manager closed during load"
                        )
                    replica.load_s = time.perf_counter() - started
                    replica.transition(ReplicaState.RESIDENT)
                return replica.load_s
            except BaseException as exc:
                with self._lock:
                    self._release(replica)
                    with replica.cond:
                        replica.error = f"{type(exc).__name__}: {exc}"
                        replica.transition(ReplicaState.FAILED)
                    self._lock.notify_all()
                replica.drop(recycle=True)  # state FAILED from LOADING: no run ever entered
                raise

    def _check_devices(self, devices: Sequence[int]) -> list[int]:
        indices = list(devices)
        if not indices or any(
            type(d) is not int or not 0 <= d < len(self._arenas) for d in indices
        ):
            raise InvalidRequestError(
                "devices",
                f"must be a non-empty list of device indices in [0, {len(self._arenas)}), got {indices!r}",
            )
        if len(set(indices)) != len(indices):
            raise InvalidRequestError("devices", f"must not repeat a device, got {indices!r}")
        return indices

    def evict(self, replica_id: str) -> None:
        """Release exactly this replica's device memory once its in-flight runs finished.

        Runs submitted after the call starts get ``ReplicaEvictedError``. Waits for a load or
        a move of it to end first. A second evict of an evicted (or failed) id is a no-op; an
        id never loaded raises ``UnknownReplicaError``. If runs stay in flight past
        ``wait_timeout_s`` it raises ``DeviceBusyError`` and the replica keeps serving.
        """
        with self._op():
            replica = self._replica(replica_id)
            deadline = time.monotonic() + self.config.wait_timeout_s
            if not replica.begin_evict(deadline, self._closed):
                return
            if not replica.wait_idle(deadline, self._closed):
                replica.abort_evict(self._closed)
            with self._lock:
                self._release(replica)
                with replica.cond:
                    replica.transition(ReplicaState.EVICTED)
                self._lock.notify_all()
            replica.drop(recycle=True)  # drained: no run is in its module

    def _release(self, replica: Replica) -> None:
        """Free the replica's extents (lock held). Idempotent."""
        for i, (device, extent) in enumerate(zip(replica.devices, replica.extents, strict=True)):
            if extent is not None:
                self._arenas[device].extents.free(extent.offset_bytes)
                replica.extents[i] = None

    def compact(self, device: int) -> int:
        """Slide every idle replica on ``device`` down now; returns the bytes moved."""
        with self._op():
            self._check_devices([device])
            return self._relocator.compact(device, time.monotonic() + self.config.wait_timeout_s)

    # -- runs ----------------------------------------------------------------------------
    def run(
        self, replica_id: str, request: Any, on_event: EventSink | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Run one request on the replica (blocking, thread-safe); batched with concurrent
        runs of the same replica. Malformed requests raise ``InvalidRequestError``.

        ``generate`` only: ``on_event`` receives each token's event as it is decoded (on the
        decoding thread: keep it cheap), and ``cancel`` ends the request at the next step
        boundary (``finish_reason`` "cancelled"; its KV rows are freed).
        """
        with self._op():
            replica = self._replica(replica_id)
            service = replica.service
            assert service.model is not None
            parsed = HANDLERS[service.handler].parse(request, service.model, service.name)
            if service.handler == "generate":
                return self._decoders.run(replica, parsed, on_event, cancel)
            result: dict[str, Any] = self._batcher.submit(
                replica, parsed, lambda items: self._execute(replica, items)
            )
            return result

    async def run_async(
        self, replica_id: str, request: Any, on_event: EventSink | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """``run`` on a worker thread: the event loop never parses, waits or computes."""
        return await self._in_pool(self.run, replica_id, request, on_event, cancel)

    async def load_async(self, replica_id: str, service: str, devices: Sequence[int]) -> float:
        return await self._in_pool(self.load, replica_id, service, devices)

    async def evict_async(self, replica_id: str) -> None:
        await self._in_pool(self.evict, replica_id)

    async def _in_pool(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, fn, *args)
        except RuntimeError as exc:  # the pool is shut down
            raise ManagerClosedError("the GPU manager is closed") from exc
        return await future

    def _execute(self, replica: Replica, items: list[Any]) -> list[Any]:
        """Batch leader's body: enter the replica, forward pass, leave. One result per item."""
        replica.enter(time.monotonic() + self.config.wait_timeout_s, self._closed)
        try:
            assert replica.model is not None
            with torch.inference_mode(), device_context(replica.home_device):
                results = run_items(replica, items)
        finally:
            replica.exit(len(items))
        if self._closed.is_set():
            cancelled = CallCancelledError(
                f"replica {replica.replica_id!r}: the GPU manager closed during the run"
            )
            return [cancelled] * len(items)
        return results

    def generation_status(self, replica_id: str) -> dict[str, int]:
        """The replica's decode batch (``generation.ReplicaDecoders.status``)."""
        return self._decoders.status(self._replica(replica_id))

    # -- observation ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: devices, services and replicas."""
        with self._lock:
            return manager_status(self._arenas, self._services, self._replicas)

    def check_invariants(self) -> None:
        """Extent accounting is consistent and equals what live replicas hold (tests)."""
        with self._lock:
            check_extents(self._arenas, self._replicas.values())
