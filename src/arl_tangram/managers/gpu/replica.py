"""Shell: one replica (a device copy of a service) and its state machine.

A replica is created by ``GpuManager.load`` under the id the core chose. Its weights live in
one arena extent per device (``extents[i]`` on ``devices[i]`` holds shard ``i``); its module
is a skeleton of the service's module tree (``skeleton.py``: taken from the service's pool,
used by no other live replica) whose tensors are bound to views of those extents, so several
replicas of one service serve at once, each with its own device copy. A swap-in is the copy
of the host bytes plus that binding; the module tree is not rebuilt.

Each replica has its own condition variable guarding ``state`` and ``num_in_flight``; the
manager's lock is taken before a replica's, never after (lock order: manager -> replica).
Runs enter only in ``RESIDENT``; ``MOVING`` (compaction) and ``LOADING`` make them wait;
``EVICTING``/``EVICTED``/``FAILED`` refuse them.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import MutableMapping
from typing import Any

import torch

from arl_tangram.managers.gpu.arena import DeviceArena
from arl_tangram.managers.gpu.errors import (
    CallCancelledError,
    DeviceBusyError,
    ReplicaEvictedError,
    ReplicaFailedError,
)
from arl_tangram.managers.gpu.extents import Extent
from arl_tangram.managers.gpu.layout import Shard
from arl_tangram.managers.gpu.routing import install_routing, module_devices
from arl_tangram.managers.gpu.service import LoadedModel, ModelService
from arl_tangram.managers.gpu.skeleton import Skeleton


class ReplicaState(enum.Enum):
    LOADING = "loading"
    RESIDENT = "resident"
    MOVING = "moving"
    EVICTING = "evicting"
    EVICTED = "evicted"
    FAILED = "failed"


# Valid transitions, one comment per edge; anything else raises.
TRANSITIONS: dict[tuple[ReplicaState, ReplicaState], str] = {
    (ReplicaState.LOADING, ReplicaState.RESIDENT): "copied and published: runs may enter",
    (
        ReplicaState.LOADING,
        ReplicaState.FAILED,
    ): "the copy raised or the manager closed; extents released",
    (
        ReplicaState.RESIDENT,
        ReplicaState.MOVING,
    ): "compaction picked it; new runs wait, in-flight ones drain",
    (ReplicaState.MOVING, ReplicaState.RESIDENT): "bytes moved and tensors re-pointed",
    (
        ReplicaState.MOVING,
        ReplicaState.FAILED,
    ): "the move's copy raised: bytes may be half-moved, dropped",
    (
        ReplicaState.RESIDENT,
        ReplicaState.EVICTING,
    ): "evict(): new runs refused, in-flight ones drain",
    (
        ReplicaState.EVICTING,
        ReplicaState.EVICTED,
    ): "drained; extents released (weights are read-only)",
    (
        ReplicaState.EVICTING,
        ReplicaState.RESIDENT,
    ): "evict timed out waiting for runs: keep serving",
    (ReplicaState.RESIDENT, ReplicaState.FAILED): "manager closed: the replica is gone",
    (ReplicaState.MOVING, ReplicaState.EVICTED): "manager closed during a move",
    (ReplicaState.EVICTING, ReplicaState.FAILED): "manager closed during an eviction",
}


class Replica:
    """A replica of ``service`` on arena indices ``devices``."""

    def __init__(
        self, replica_id: str, service: ModelService, devices: list[int], shards: tuple[Shard, ...]
    ) -> None:
        self.replica_id = replica_id
        self.service = service
        self.devices = devices
        self.shards = shards
        self.extents: list[Extent | None] = [None] * len(shards)
        self.state = ReplicaState.LOADING
        self.error: str | None = None
        self.num_in_flight = 0
        self.num_requests = 0
        self.load_s = 0.0
        self.cond = threading.Condition()
        self.model: LoadedModel | None = None
        self.tensor_device: list[int] = []  # shard index of every tensor
        self.route_log: list[Any] | None = None  # set to a list to trace routing (tests)
        self._hooks: list[Any] = []
        self._arenas: list[DeviceArena] = []
        self._skeleton: Skeleton | None = None
        self._run_arenas: list[DeviceArena] = []  # where runs are counted; kept after drop

    # -- state machine -------------------------------------------------------------------
    def transition(self, new: ReplicaState) -> None:
        """Call with ``cond`` held."""
        if (self.state, new) not in TRANSITIONS:
            raise RuntimeError(
                f"replica {self.replica_id!r}: invalid transition {self.state.value} -> {new.value}"
            )
        self.state = new
        self.cond.notify_all()

    def end_on_close(self) -> None:
        """Close ends the replica: live states fail, a move ends evicted (takes ``cond``)."""
        with self.cond:
            if self.state in (ReplicaState.LOADING, ReplicaState.RESIDENT, ReplicaState.EVICTING):
                self.transition(ReplicaState.FAILED)
                self.error = "the GPU manager closed"
            elif self.state is ReplicaState.MOVING:
                self.transition(ReplicaState.EVICTED)

    def enter(self, deadline: float, closed: threading.Event) -> None:
        """Start a run: wait out LOADING/MOVING (until ``deadline``), refuse the end states."""
        with self.cond:
            while self.state in (ReplicaState.LOADING, ReplicaState.MOVING) and not closed.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeviceBusyError(
                        f"replica {self.replica_id!r} stayed {self.state.value} until the timeout"
                    )
                self.cond.wait(min(remaining, 0.5))
            if closed.is_set():
                raise CallCancelledError(f"replica {self.replica_id!r}: the GPU manager closed")
            if self.state is ReplicaState.RESIDENT:
                self.num_in_flight += 1
                for arena in self._run_arenas:
                    arena.run_started()  # copies on these devices yield to this run
                return
            if self.state is ReplicaState.FAILED:
                raise ReplicaFailedError(self.replica_id, self.error or "failed")
            raise ReplicaEvictedError(self.replica_id)

    def exit(self, num_items: int) -> None:
        with self.cond:
            for arena in self._run_arenas:
                arena.run_ended()
            self.num_in_flight -= 1
            self.num_requests += num_items
            self.cond.notify_all()

    def begin_evict(self, deadline: float, closed: threading.Event) -> bool:
        """RESIDENT -> EVICTING, after a load, move or other eviction of it ended.

        ``False`` when it is already evicted or failed (evict is then a no-op).
        """
        with self.cond:
            while self.state in (ReplicaState.LOADING, ReplicaState.MOVING, ReplicaState.EVICTING):
                if closed.is_set():
                    raise CallCancelledError(f"replica {self.replica_id!r}: the GPU manager closed")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeviceBusyError(
                        f"replica {self.replica_id!r} stayed {self.state.value} until the timeout"
                    )
                self.cond.wait(min(remaining, 0.5))
            if self.state in (ReplicaState.EVICTED, ReplicaState.FAILED):
                return False
            self.transition(ReplicaState.EVICTING)
            return True

    def abort_evict(self, closed: threading.Event) -> None:
        """Runs did not drain in time: keep serving and raise (close ends it instead)."""
        with self.cond:
            if closed.is_set():
                raise CallCancelledError(f"replica {self.replica_id!r}: the GPU manager closed")
            self.transition(ReplicaState.RESIDENT)
        raise DeviceBusyError(f"replica {self.replica_id!r}: runs stayed in flight; not evicted")

    def wait_idle(self, deadline: float, closed: threading.Event | None = None) -> bool:
        """Wait until no run is in flight; ``False`` on timeout (or when ``closed`` is set)."""
        with self.cond:
            while self.num_in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (closed is not None and closed.is_set()):
                    return False
                self.cond.wait(min(remaining, 0.5))
            return True

    # -- device copy (no lock held: the extents are reserved for this replica) ------------
    def materialise(self, arenas: list[DeviceArena]) -> None:
        """Copy every shard into its extent, then bind a pooled skeleton to the copies."""
        service = self.service
        assert service.model is not None and service.skeletons is not None
        self._arenas = [arenas[d] for d in self.devices]
        self._run_arenas = self._arenas
        for shard, extent, arena in zip(self.shards, self.extents, self._arenas, strict=True):
            assert extent is not None
            arena.copy_in(
                extent.offset_bytes, service.host.narrow(0, shard.host_start_bytes, shard.nbytes)
            )
        self.tensor_device = [0] * len(service.refs)
        for i, shard in enumerate(self.shards):
            self.tensor_device[shard.first_tensor : shard.stop_tensor] = [i] * (
                shard.stop_tensor - shard.first_tensor
            )
        self._skeleton = service.skeletons.acquire(self._devices_key)
        self.model = self._skeleton.model
        self._skeleton.bind(self._views())
        if len(self.shards) > 1:
            self._install_routing()

    @property
    def _devices_key(self) -> tuple[str, ...]:
        return tuple(str(arena.device) for arena in self._arenas)

    def _views(self) -> list[torch.Tensor]:
        service = self.service
        views = []
        for index, ref in enumerate(service.refs):
            shard_index = self.tensor_device[index]
            shard, extent = self.shards[shard_index], self.extents[shard_index]
            assert extent is not None
            offset = (
                extent.offset_bytes
                + service.host_layout.offsets_bytes[index]
                - shard.host_start_bytes
            )
            views.append(
                self._arenas[shard_index].typed_view(offset, ref.nbytes, ref.dtype, ref.shape)
            )
        return views

    def repoint(self) -> None:
        """Point the module at the current extents (after a move's copy; runs are held off)."""
        assert self._skeleton is not None
        self._skeleton.bind(self._views())

    def _install_routing(self) -> None:
        assert self.model is not None
        module = self.model.module
        by_id: dict[int, int] = {}
        for index, ref in enumerate(self.service.refs):
            if ref.param_name is not None:
                by_id[id(module.get_parameter(ref.param_name))] = self.tensor_device[index]
            for owner, key in ref.buffer_owners:
                by_id[id(module.get_submodule(owner)._buffers[key])] = self.tensor_device[index]
        placement = module_devices(module, by_id)
        devices = [arena.device for arena in self._arenas]
        log = self.route_log
        self._hooks = install_routing(module, placement, devices, 0, log)

    def set_route_log(self, log: list[Any] | None) -> None:
        """Trace routing into ``log`` (device-shim tests); reinstalls the hooks."""
        self.route_log = log
        for hook in self._hooks:
            hook.remove()
        if len(self.shards) > 1 and self.model is not None:
            self._install_routing()

    @property
    def home_device(self) -> torch.device:
        return self._arenas[0].device

    def drop(self, recycle: bool = False) -> None:
        """Forget the device copy (after its extents were released). ``recycle``: no run can be
        in the module any more (drained eviction, failed load), so its skeleton goes back to
        the service's pool; otherwise (close, runs maybe still in it) it is left to the GC."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        skeleton, self._skeleton = self._skeleton, None
        if skeleton is not None and recycle and self.service.skeletons is not None:
            self.service.skeletons.release(self._devices_key, skeleton)
        elif skeleton is not None and self.num_in_flight == 0:
            skeleton.unbind()  # let go of the arena now, not at a later GC pass
        self.model = None
        self._arenas = []


def prune_tombstones(replicas: MutableMapping[str, Replica], keep: int) -> None:
    """Forget all but the newest ``keep`` evicted or failed replicas (manager lock held); they
    are remembered only so that runs on their ids get a clear error."""
    ended = [
        rid for rid, r in replicas.items() if r.state in (ReplicaState.EVICTED, ReplicaState.FAILED)
    ]
    for rid in ended[: max(0, len(ended) - keep)]:
        del replicas[rid]
