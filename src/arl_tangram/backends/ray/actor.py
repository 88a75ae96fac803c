"""Shell: the node agent actor of the Ray backend: it owns the CPU and GPU managers of the
Ray node it was placed on (node affinity, by ``backends.ray.membership``).

The actor is a threaded Ray actor: blocking manager calls run on its threads (up to
``max_concurrency`` at once), so one long action never holds up another. ``ping`` and
``cancel`` run in their own concurrency group, so a node whose threads are all busy with
actions still answers its heartbeat. Manager calls arrive as (port, method, args) and are
checked against the ports of ``agent.ports``: the actor runs exactly what a local agent's
caller could run, nothing else.

Large outputs stay on the node: an action's stream or a service's output of at least the
caller's ``hold_min_bytes`` goes to the node's object store and only its reference travels
back (``backends.ray.held``).

A node the controller declared lost by mistake (a long pause, a network blip) is taken
back with ``reset(epoch)``: everything it held is dropped (the controller has already ended
its actions and told its envs' owners), and it reports its capacity afresh. Every manager
call names the epoch its caller knows; a call of an earlier epoch (sent before the pause,
run after it) is refused with ``StaleCallError``, so it can never touch the new managers.

Its managers die with it: ``close`` destroys every sandbox and model; a killed actor's CPU
manager is cleaned by its keeper process (``managers.cpu.keeper``), which Ray must be told
to spare when the actor's process dies (``KEEP_CHILDREN_ENV``). Cgroups are named after the actor's own process and a
start-up sweep touches only roots whose owner is dead, so two agents on one host never
sweep each other.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arl_tangram.agent.node import local_mem_bytes
from arl_tangram.agent.ports import CpuPort, GpuPort
from arl_tangram.backends.ray.held import hold_streams, hold_value
from arl_tangram.managers.cpu.config import CpuManagerConfig

log = logging.getLogger(__name__)

CONTROL_GROUP = "control"  # ping and cancel: never queued behind actions
# Ray kills a worker's child processes when the worker exits; the CPU manager's keeper is
# one, and must outlive a dead actor to kill its sandboxes and remove their cgroups. Start
# the nodes with this in their environment, or give it to the agents as a runtime env
# (``RaySettings.actor_runtime_env``: a fresh worker per agent, seconds more per join).
KEEP_CHILDREN_ENV = {"RAY_kill_child_processes_on_worker_exit": "false"}
# Which methods each port forwards: the Protocols' own, less what the proxy answers from
# the registration report (numa_cores, device_capacity_bytes) or the actor does itself (close).
_FORWARDED = {
    "cpu": frozenset(n for n in dir(CpuPort) if not n.startswith("_"))
    - {"numa_cores", "close", "exec", "run_in_session"},
    "gpu": frozenset(n for n in dir(GpuPort) if not n.startswith("_"))
    - {"device_capacity_bytes", "close"},
}
_CANCELLABLE = frozenset({"exec", "run_in_session"})


def _control(fn: Any) -> Any:
    """``ray.method(concurrency_group=CONTROL_GROUP)`` without importing ray here (the same
    attribute it sets), so the method is in that group in the driver and the worker alike."""
    fn.__ray_concurrency_group__ = CONTROL_GROUP
    return fn


class StaleCallError(RuntimeError):
    """A call sent to a node before it was reset (its caller's node was declared lost)."""


@dataclass(frozen=True)
class GpuSettings:
    """How the actor makes its GPU manager: ``devices`` ``"auto"`` (the CUDA devices Ray
    gave the actor, else one CPU device) or a count of CPU devices, each with an arena of
    ``device_mem_bytes``; ``mem_fraction`` of each CUDA device's memory."""

    devices: str | int = "auto"
    device_mem_bytes: int = 2 << 30
    mem_fraction: float = 0.8


@dataclass(frozen=True)
class NodeReport:
    """What a node agent reports at registration: its real capacity, and who it is (the
    cgroup root of its CPU manager, so a check can prove its sandboxes gone)."""

    agent_id: str
    hostname: str
    pid: int
    host_mem_bytes: int
    numa_cores: tuple[int, ...] | None
    device_capacity_bytes: tuple[int, ...] | None
    cgroup_root: str | None


class NodeAgentActor:
    """The managers of one Ray node. Made through ``ray.remote`` by ``actor_class``."""

    def __init__(
        self, agent_id: str, cpu_config: CpuManagerConfig | None, gpu: GpuSettings | None
    ) -> None:
        self.agent_id = agent_id
        self.cpu_config, self.gpu_settings = cpu_config, gpu
        self.cpu: Any = None
        self.gpu: Any = None
        self._cancels: dict[str, threading.Event] = {}
        self._lock = threading.Lock()  # the managers and the epoch change together under it
        self.epoch = 0
        self._open_managers()

    def _open_managers(self) -> None:
        if self.cpu_config is not None:
            from arl_tangram.managers.cpu.manager import CpuManager

            self.cpu = CpuManager(self.cpu_config)
        if self.gpu_settings is not None:
            try:
                self.gpu = _make_gpu_manager(self.gpu_settings)
            except BaseException:
                self.close()
                raise

    def report(self) -> NodeReport:
        """The node's capacity as its managers see it (called once, at registration)."""
        return NodeReport(
            self.agent_id, socket.gethostname(), os.getpid(), local_mem_bytes(),
            tuple(self.cpu.numa_cores()) if self.cpu is not None else None,
            tuple(self.gpu.device_capacity_bytes()) if self.gpu is not None else None,
            self.cpu.root_name if self.cpu is not None else None,
        )  # fmt: skip

    @_control
    def ping(self) -> float:
        """The heartbeat: proves the actor's process and its node are alive."""
        return time.time()

    def call(
        self,
        port: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        epoch: int = 0,
    ) -> Any:
        """One manager call, as a local agent's caller would make it. Raises what the
        manager raises; ``AttributeError`` for a method no port forwards."""
        return getattr(self._port(port, method, epoch), method)(*args, **kwargs)

    def call_cancellable(
        self, port: str, method: str, call_id: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
        hold_min_bytes: int | None = None, epoch: int = 0,
    ) -> Any:  # fmt: skip
        """An action (``exec``, ``run_in_session``) that ``cancel(call_id)`` can stop: the
        manager gets a cancel flag of this process in place of the caller's. Streams of at
        least ``hold_min_bytes`` stay here, by reference (``held.hold_streams``)."""
        if method not in _CANCELLABLE:
            raise AttributeError(f"{method} is not a cancellable call")
        flag = threading.Event()
        with self._lock:
            self._cancels[call_id] = flag
        try:
            result = getattr(self._manager(port, epoch), method)(*args, **kwargs, cancel=flag)
        finally:
            with self._lock:
                self._cancels.pop(call_id, None)
        return hold_streams(result, hold_min_bytes)

    def run_service(
        self, replica_id: str, request: Any, hold_min_bytes: int | None = None, epoch: int = 0
    ) -> Any:
        """``GpuManager.run``; an output of at least ``hold_min_bytes`` (pickled) stays
        here, by reference (``held.hold_value``)."""
        return hold_value(self._manager("gpu", epoch).run(replica_id, request), hold_min_bytes)

    def reset(self, epoch: int) -> NodeReport:
        """Enter ``epoch``: drop everything this node holds (calls in flight are cancelled,
        every sandbox and model destroyed, calls of earlier epochs refused) and start afresh
        with new managers; returns the new capacity report. For a node the controller
        declared lost that answers again: the controller forgot its envs and replicas, so
        all of them are stale."""
        with self._lock:
            self.epoch = epoch
            stale = {"gpu": self.gpu, "cpu": self.cpu}
            self.gpu = self.cpu = None
            for flag in self._cancels.values():
                flag.set()
        problems = _close(stale)
        if problems:
            log.warning("agent %s: closing stale managers: %s", self.agent_id, problems)
        self._open_managers()
        return self.report()

    @_control
    def cancel(self, call_id: str) -> bool:
        """Stop a cancellable call (it ends ``cancelled``). False if it is not running."""
        with self._lock:
            flag = self._cancels.get(call_id)
        if flag is None:
            return False
        flag.set()
        return True

    def register_service(
        self, name: str, handler: str, folder: str | None, module: str | None, epoch: int = 0,
        kv: Any = None,
    ) -> Any:  # fmt: skip
        """Register a model service from a folder on this node or a ``pkg.mod:factory``
        importable here; returns its ``ServiceInfo``."""
        gpu = self._manager("gpu", epoch)
        if folder is not None:
            return gpu.register_folder(name, Path(folder), handler, kv)
        if module is None:
            raise ValueError("a service needs a folder or a module")
        module_name, _, attr = module.partition(":")
        return gpu.register_module(
            name, getattr(importlib.import_module(module_name), attr), handler, kv
        )

    def close(self) -> list[str]:
        """Destroy every sandbox and model of this node. Idempotent; returns what failed."""
        with self._lock:
            managers = {"gpu": self.gpu, "cpu": self.cpu}
            self.gpu = self.cpu = None
        return _close(managers)

    def _manager(self, port: str, epoch: int) -> Any:
        with self._lock:  # the epoch and the manager of one call are read together
            if epoch != self.epoch:
                raise StaleCallError(
                    f"agent {self.agent_id}: a call of epoch {epoch}, sent before the node's reset"
                )
            manager = getattr(self, port, None) if port in ("cpu", "gpu") else None
        if manager is None:
            raise RuntimeError(f"agent {self.agent_id} has no {port} manager")
        return manager

    def _port(self, port: str, method: str, epoch: int) -> Any:
        if method not in _FORWARDED.get(port, ()):
            raise AttributeError(f"{port}.{method} is not a call a node agent forwards")
        return self._manager(port, epoch)


def _close(managers: Mapping[str, Any]) -> list[str]:
    """Close each manager (GPU first), going on past failures; returns what failed."""
    problems: list[str] = []
    for name, manager in managers.items():
        if manager is None:
            continue
        try:
            manager.close()
        except Exception as exc:  # noqa: BLE001 - close goes on past each manager's failure
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems


def _make_gpu_manager(gpu: GpuSettings) -> Any:
    from arl_tangram.managers.gpu.devices import discover_devices
    from arl_tangram.managers.gpu.manager import GpuManager

    if gpu.devices == "auto":
        devices = discover_devices(
            cpu_mem_bytes=(gpu.device_mem_bytes,), cuda_mem_fraction=gpu.mem_fraction
        )
    else:
        devices = discover_devices(
            cpu_mem_bytes=(gpu.device_mem_bytes,) * int(gpu.devices), use_cuda=False
        )
    return GpuManager(devices)


def actor_class(max_concurrency: int) -> Any:
    """``NodeAgentActor`` as a Ray actor class (threaded; ``ping``/``cancel`` apart)."""
    import ray

    remote: Any = ray.remote  # its stubs lack the actor-only options
    return remote(
        max_concurrency=max_concurrency, concurrency_groups={CONTROL_GROUP: 2}, max_restarts=0, num_cpus=0,
    )(NodeAgentActor)  # fmt: skip
