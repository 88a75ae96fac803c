"""Shell: ``StandaloneGpuManager``, a name-addressed convenience wrapper with its own policy.

Not on the live path: there the core chooses placements and victims and calls
``GpuManager`` by replica id. Scripts and benchmarks that have no core use this wrapper:
one replica per service (its id is the service name), on the first aligned group of
``num_devices`` devices with room, least-recently-used replicas evicted until it fits.

The policy lock serialises placement decisions, never the work they decide: a load (the
copy into the arena) and an eviction (which drains runs) happen outside it, so a resident
service's calls never wait on another service's load. A placement reserves its devices
and bytes under the lock (``_pending``, counted as taken until the load's own extents
show), loads outside it, and publishes under it. Runs never take the lock. A run whose
replica was evicted between placement and run is placed again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arl_tangram.managers.gpu.devices import DeviceSpec
from arl_tangram.managers.gpu.errors import (
    DeviceBusyError,
    NeverFitsError,
    ReplicaEvictedError,
    UnknownReplicaError,
)
from arl_tangram.managers.gpu.manager import Factory, GpuManager, GpuManagerConfig
from arl_tangram.managers.gpu.service import ServiceInfo

_MAX_PLACEMENTS = 8  # a run re-places its replica at most this often before giving up


class StandaloneGpuManager:
    """``call``/``call_sync``/``prefetch``/``evict_service`` by service name, LRU eviction."""

    def __init__(
        self, devices: Sequence[DeviceSpec] | None = None, config: GpuManagerConfig | None = None
    ) -> None:
        self.manager = GpuManager(devices, config)
        self._policy = threading.Condition()
        self._users: dict[str, int] = {}  # callers between placement and the end of their run
        # loads (devices, bytes per device) and evictions ([], 0) in progress outside the lock
        self._pending: dict[str, tuple[list[int], int]] = {}
        self._widths: dict[str, int] = {}
        self._last_used: dict[str, int] = {}
        self._seq = 0
        self.num_loads: dict[str, int] = {}
        self.num_evictions: dict[str, int] = {}

    def __enter__(self) -> StandaloneGpuManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.manager.close()

    def register_module(
        self, name: str, factory: Factory, handler: str, num_devices: int = 1
    ) -> ServiceInfo:
        self._check_width(name, num_devices)
        info = self.manager.register_module(name, factory, handler)
        self._widths[name] = num_devices
        return info

    def register_folder(
        self, name: str, path: str | Path, handler: str, num_devices: int = 1
    ) -> ServiceInfo:
        self._check_width(name, num_devices)
        info = self.manager.register_folder(name, path, handler)
        self._widths[name] = num_devices
        return info

    def _check_width(self, name: str, num_devices: int) -> None:
        total = len(self.manager.devices)
        if num_devices < 1 or num_devices > total or total % num_devices:
            raise NeverFitsError(
                f"service {name!r} needs {num_devices} devices; this node has {total}"
            )

    def footprint_bytes(self, name: str) -> int:
        return self.manager.footprint_bytes(name, self._widths[name])

    def call_sync(self, name: str, request: Any) -> dict[str, Any]:
        """Place ``name`` if needed (evicting LRU replicas), then run the request."""
        for _ in range(_MAX_PLACEMENTS):
            self._place(name, use=True)
            try:
                return self.manager.run(name, request)
            except (ReplicaEvictedError, UnknownReplicaError):
                continue  # evicted by ``evict_service`` in between: place again
            finally:
                with self._policy:
                    self._users[name] -= 1
                    self._policy.notify_all()
        raise ReplicaEvictedError(name)

    async def call(self, name: str, request: Any) -> dict[str, Any]:
        return await asyncio.to_thread(self.call_sync, name, request)

    def prefetch(self, name: str) -> float:
        """Make ``name`` resident now; returns the copy seconds (0 when it already was)."""
        return self._place(name)

    def evict_service(self, name: str) -> bool:
        """Evict ``name``'s replica if it is resident; returns whether it was. The eviction
        (which waits for the replica's runs to drain) runs outside the policy lock."""
        with self._policy:
            if self._state(name) != "resident" or name in self._pending:
                return False
            self._pending[name] = ([], 0)  # no placement of it starts while it drains
        try:
            self.manager.evict(name)
        finally:
            with self._policy:
                del self._pending[name]
                self._policy.notify_all()
        with self._policy:
            self.num_evictions[name] = self.num_evictions.get(name, 0) + 1
        return True

    def status(self) -> dict[str, Any]:
        return self.manager.status()

    def check_invariants(self) -> None:
        self.manager.check_invariants()

    def _state(self, name: str) -> str | None:
        try:
            return self.manager.replica_state(name)
        except UnknownReplicaError:
            return None

    def _place(self, name: str, use: bool = False) -> float:
        """Make ``name`` resident; with ``use`` it stays so until the caller's run ends."""
        deadline = time.monotonic() + self.manager.config.wait_timeout_s
        seconds = 0.0
        with self._policy:
            self._seq += 1
            self._last_used[name] = self._seq
        while True:
            with self._policy:
                devices = self._reserve(name, use, deadline)
                if devices is None:
                    return seconds
            loaded = False
            try:
                seconds = self.manager.load(name, name, devices)  # the copy: no policy lock
                loaded = True
            finally:
                with self._policy:
                    del self._pending[name]
                    if loaded:
                        self.num_loads[name] = self.num_loads.get(name, 0) + 1
                    self._policy.notify_all()

    def _reserve(self, name: str, use: bool, deadline: float) -> list[int] | None:
        """(Policy lock held.) ``None`` when ``name`` is resident (then counted in use with
        ``use``); else the devices its load goes to, evicting LRU idle replicas first and
        reserving the bytes in ``_pending``. Waits while ``name`` is being loaded or evicted
        by another caller, or while replicas in use block every placement."""
        while True:
            if name not in self._pending:
                if self._state(name) == "resident":
                    if use:
                        self._users[name] = self._users.get(name, 0) + 1
                    return None
                width = self._widths.get(name, 1)
                need = self.manager.footprint_bytes(name, width)
                free = self._free_bytes()
                devices = self._choose(free, width, need)
                victims = self._victims(name, free, devices, need)
                if victims is not None:
                    for victim in victims:  # idle and unused: nothing to drain, no copy
                        self.manager.evict(victim)
                        self.num_evictions[victim] = self.num_evictions.get(victim, 0) + 1
                    self._pending[name] = (devices, need)
                    return devices
            if not self._policy.wait(max(0.0, deadline - time.monotonic())):
                raise DeviceBusyError(f"service {name!r}: every replica stayed in use")

    def _free_bytes(self) -> list[int]:
        """Free bytes per device, less what pending loads reserved and have not yet taken
        (their replica does not show all its extents yet)."""
        status = self.manager.status()
        free = [s["free_bytes"] for s in status["devices"]]
        for pending, (devices, need) in self._pending.items():
            r = status["replicas"].get(pending)
            if r is None or r["state"] != "loading" or not all(r["extent_bytes"]):
                for d in devices:
                    free[d] -= need
        return free

    def _choose(self, free: list[int], width: int, need: int) -> list[int]:
        """The aligned group whose tightest device has the most free bytes (lowest first)."""
        groups = [list(range(s, s + width)) for s in range(0, len(free), width)]
        return max(
            groups, key=lambda g: (min(free[d] for d in g) >= need, min(free[d] for d in g), -g[0])
        )

    def _victims(self, name: str, free_now: list[int], devices: list[int], need: int) -> list[str] | None:
        """LRU idle replicas on ``devices`` to evict until each has ``need`` free bytes;
        ``None`` when even evicting all of them would not be enough."""
        status = self.manager.status()
        free = {d: free_now[d] for d in devices}
        ids = {s["device_id"]: i for i, s in enumerate(status["devices"])}
        resident = [
            (self._last_used.get(rid, 0), rid, [ids[d] for d in r["devices"]], r["extent_bytes"])
            for rid, r in status["replicas"].items()
            if r["state"] == "resident" and rid != name and not self._users.get(rid) and rid not in self._pending
        ]
        victims = []
        for _, rid, on, sizes in sorted(resident):
            if all(free[d] >= need for d in devices):
                break
            if any(d in free for d in on):
                victims.append(rid)
                for d, size in zip(on, sizes, strict=True):
                    if d in free:
                        free[d] += size
        return victims if all(free[d] >= need for d in devices) else None
