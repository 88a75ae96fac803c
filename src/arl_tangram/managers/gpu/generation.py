"""Shell: the decode loops of a GPU manager's generating replicas, and runs on them.

Who calls: ``GpuManager.run`` for ``generate`` services (the request already parsed) and
``GpuManager.generation_status``. One ``decoding.DecodeLoop`` per replica, created on its
first run and forgotten with the replica (weak keys). A sequence enters the replica for
its whole life (it counts as a run in flight), so an eviction waits for the batch in flight
and a replica never moves (compaction) while it decodes.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import torch

from arl_tangram.managers.gpu.decoding import DecodeLoop, EventSink
from arl_tangram.managers.gpu.errors import (
    CallCancelledError,
    DeviceOutOfMemoryError,
    GpuManagerError,
    ServiceRuntimeError,
)
from arl_tangram.managers.gpu.routing import device_context

if TYPE_CHECKING:
    from arl_tangram.managers.gpu.replica import Replica


class ReplicaDecoders:
    """Decode loops by replica. Thread-safe (its own lock, held only to find a loop)."""

    def __init__(self, closed: threading.Event, wait_timeout_s: float) -> None:
        self._closed = closed
        self._wait_timeout_s = wait_timeout_s
        self._lock = threading.Lock()
        self._loops: weakref.WeakKeyDictionary[Replica, DecodeLoop] = weakref.WeakKeyDictionary()

    def run(
        self, replica: Replica, request: Any, on_event: EventSink | None, cancel: threading.Event | None
    ) -> dict[str, Any]:
        """One sequence in the replica's continuous batch (blocking); its response."""
        replica.enter(time.monotonic() + self._wait_timeout_s, self._closed)
        try:
            loop = self._loop(replica)
            with torch.inference_mode(), device_context(replica.home_device):
                result = loop.run(request, on_event, cancel)
        except GpuManagerError:
            raise
        except torch.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(f"service {replica.service.name!r}: out of memory: {exc}") from exc
        except Exception as exc:
            raise ServiceRuntimeError(f"service {replica.service.name!r} raised {type(exc).__name__}: {exc}") from exc
        finally:
            replica.exit(1)
        if self._closed.is_set():
            raise CallCancelledError(f"replica {replica.replica_id!r}: the GPU manager closed during the run")
        return result

    def _loop(self, replica: Replica) -> DecodeLoop:
        with self._lock:
            loop = self._loops.get(replica)
            if loop is None:
                assert replica.model is not None
                service = replica.service
                loop = self._loops[replica] = DecodeLoop(
                    replica.model, replica.home_device, service.max_batch,
                    service.kv_cache_bytes, service.kv_bytes_per_token, self._closed,
                )  # fmt: skip
            return loop

    def status(self, replica: Replica) -> dict[str, int]:
        """Sequences active and waiting, decode steps, KV bytes reserved and held by the
        cache now, the budget (zeros before the replica's first run)."""
        with self._lock:
            loop = self._loops.get(replica)
        if loop is not None:
            return loop.status()
        budget = replica.service.kv_cache_bytes
        return {"active": 0, "waiting": 0, "steps": 0, "kv_reserved_bytes": 0, "kv_bytes_in_use": 0, "kv_budget_bytes": budget}
