"""Shell: ``StandaloneGpuManager``, a name-addressed convenience wrapper with its own policy.

Not on the live path: there the core chooses placements and victims and calls
``GpuManager`` by replica id. Scripts and benchmarks that have no core use this wrapper:
one replica per service (its id is the service name), on the first aligned group of
``num_devices`` devices with room, least-recently-used replicas evicted until it fits.

The policy lock serialises placement decisions (and so this wrapper's loads); runs never
take it. A run whose replica was evicted between placement and run is placed again.
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
        """Evict ``name``'s replica if it is resident; returns whether it was."""
        with self._policy:
            if self._state(name) != "resident":
                return False
            self.manager.evict(name)
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
        with self._policy:
            self._seq += 1
            self._last_used[name] = self._seq
            seconds = 0.0
            while self._state(name) != "resident":
                width = self._widths.get(name, 1)
                need = self.manager.footprint_bytes(name, width)
                devices = self._choose(width, need)
                victims = self._victims(name, devices, need)
                if victims is None:  # replicas in use block it: wait for a run to end
                    if not self._policy.wait(max(0.0, deadline - time.monotonic())):
                        raise DeviceBusyError(f"service {name!r}: every replica stayed in use")
                    continue
                for victim in victims:
                    self.manager.evict(victim)
                    self.num_evictions[victim] = self.num_evictions.get(victim, 0) + 1
                seconds = self.manager.load(name, name, devices)
                self.num_loads[name] = self.num_loads.get(name, 0) + 1
            if use:
                self._users[name] = self._users.get(name, 0) + 1
            return seconds

    def _choose(self, width: int, need: int) -> list[int]:
        """The aligned group whose tightest device has the most free bytes (lowest first)."""
        free = self.manager.device_free_bytes()
        groups = [list(range(s, s + width)) for s in range(0, len(free), width)]
        return max(
            groups, key=lambda g: (min(free[d] for d in g) >= need, min(free[d] for d in g), -g[0])
        )

    def _victims(self, name: str, devices: list[int], need: int) -> list[str] | None:
        """LRU idle replicas on ``devices`` to evict until each has ``need`` free bytes;
        ``None`` when even evicting all of them would not be enough."""
        status = self.manager.status()
        free = {d: status["devices"][d]["free_bytes"] for d in devices}
        ids = {s["device_id"]: i for i, s in enumerate(status["devices"])}
        resident = [
            (self._last_used.get(rid, 0), rid, [ids[d] for d in r["devices"]], r["extent_bytes"])
            for rid, r in status["replicas"].items()
            if r["state"] == "resident" and rid != name and not self._users.get(rid)
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
