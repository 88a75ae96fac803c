"""Shell: proxy managers of the Ray backend: a remote node's managers behind the ports of
``agent.ports``, so the controller's dispatcher calls them exactly as local ones.

Who calls: the dispatcher's worker threads (every method here blocks, as a manager's does),
the SDK's and the API's host-side file and session calls (on threads too). Each call is one
actor task; its result comes back by reference (Ray moves a large one between object
stores, node to node, not through the GCS). A call waits in short slices so that it ends
at once, with ``NodeLostError``, when the heartbeat monitor declares its node lost, and an
action's cancel flag (a ``threading.Event`` of this process) is forwarded to the actor.
What the node reported at registration (its cores, its devices) is answered locally: the
controller asks on its event loop, which must never wait on the network. An action's output
of at least ``NodeLink.hold_min_bytes`` stays on its node (``backends.ray.held``): the exec
result names it in ``held_outputs``, a service call returns its ``RayHeldOutput`` in place
of the value (``runtime.runs`` reads both).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from arl_tangram.backends.ray.actor import NodeReport
from arl_tangram.backends.ray.held import DEFAULT_HOLD_MIN_BYTES
from arl_tangram.managers.cpu.results import ExecResult, Outcome

if TYPE_CHECKING:
    from arl_tangram.managers.cpu.config import SandboxSpec
    from arl_tangram.managers.gpu.service import ServiceInfo

WAIT_SLICE_S = 0.2  # how often a waiting call looks at its node's loss and its cancel flag
_call_ids = itertools.count()


class NodeLostError(RuntimeError):
    """The call's node was declared lost (or its agent died): its outcome is unknown."""


class NodeLink:
    """One node's agent actor and whether the monitor has declared the node lost.
    ``verdict_s`` (the monitor's loss delay and a margin) bounds how long a call that found
    the actor unreachable waits for the verdict before giving up on the call alone.
    ``hold_min_bytes``: outputs this large stay on the node (None: all travel by value)."""

    def __init__(
        self,
        agent_id: str,
        ray_node_id: str,
        actor: Any,
        report: NodeReport,
        verdict_s: float = 5.0,
        hold_min_bytes: int | None = DEFAULT_HOLD_MIN_BYTES,
        epoch: int = 0,
    ) -> None:
        self.agent_id = agent_id
        self.hold_min_bytes = hold_min_bytes
        self.epoch = epoch  # the agent's, since its last reset: its calls name it
        self.verdict_s = verdict_s  # how long a failed call waits for the monitor's verdict
        self.ray_node_id = ray_node_id
        self.actor = actor
        self.report = report
        self.lost = threading.Event()
        self.lost_why = ""

    def declare_lost(self, why: str) -> None:
        self.lost_why = why
        self.lost.set()

    def call(self, port: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """A manager call on the node (blocking)."""
        self.check()
        return self.wait(self.actor.call.remote(port, method, args, kwargs, self.epoch))

    def call_cancellable(
        self, port: str, method: str, cancel: threading.Event | None, *args: Any, **kwargs: Any
    ) -> Any:
        """An action whose ``cancel`` flag, once set, stops it on the node."""
        self.check()
        call_id = f"{self.agent_id}:{next(_call_ids)}"
        ref = self.actor.call_cancellable.remote(
            port, method, call_id, args, kwargs, self.hold_min_bytes, self.epoch
        )
        return self.wait(
            ref,
            lambda: cancel is not None and cancel.is_set(),
            lambda: self.actor.cancel.remote(call_id),
        )

    def wait(self, ref: Any, cancelled: Any = None, on_cancel: Any = None) -> Any:
        """The value of ``ref``; re-raises the manager's exception as itself; raises
        ``NodeLostError`` when the node is lost or the actor died."""
        import ray

        sent_cancel = False
        while True:
            try:
                return ray.get(ref, timeout=WAIT_SLICE_S)
            except ray.exceptions.GetTimeoutError:
                pass
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause
                raise (cause if isinstance(cause, Exception) else exc) from None
            except ray.exceptions.RayActorError as exc:
                self._await_verdict(exc)
            if self.lost.is_set():
                raise NodeLostError(f"node_lost: {self.lost_why}")
            if not sent_cancel and cancelled is not None and cancelled():
                on_cancel()
                sent_cancel = True

    def _await_verdict(self, exc: Exception) -> None:
        """The actor is unreachable or dead: wait (bounded) for the monitor's verdict, so a
        lost node's actions end the one way the core ends them (``node_lost``), then raise."""
        self.lost.wait(self.verdict_s)
        why = (
            self.lost_why
            if self.lost.is_set()
            else f"agent {self.agent_id} unreachable ({type(exc).__name__})"
        )
        raise NodeLostError(f"node_lost: {why}")

    def check(self) -> None:
        """Raise ``NodeLostError`` once the node is declared lost."""
        if self.lost.is_set():
            raise NodeLostError(f"node_lost: {self.lost_why}")


class RayCpuProxy:
    """``CpuPort`` of a remote node: every call forwarded to its agent actor."""

    def __init__(self, link: NodeLink) -> None:
        assert link.report.numa_cores is not None
        self.link = link
        self._numa_cores = link.report.numa_cores

    def numa_cores(self) -> tuple[int, ...]:
        return self._numa_cores

    def create_sandbox(
        self, spec: SandboxSpec | None = None, *, sandbox_id: str | None = None
    ) -> str:
        return str(self.link.call("cpu", "create_sandbox", spec, sandbox_id=sandbox_id))

    def hold(
        self,
        sandbox_id: str,
        millicores: int,
        numa_millicores: Sequence[int] | None = None,
        *,
        limit: bool = True,
    ) -> None:
        self.link.call("cpu", "hold", sandbox_id, millicores, _plain(numa_millicores), limit=limit)

    def list_sandboxes(self) -> list[str]:
        """A lost node's sandboxes are gone with it: none (so destroying one is a no-op)."""
        try:
            return list(self.link.call("cpu", "list_sandboxes"))
        except NodeLostError:
            return []

    def destroy_sandbox(self, sandbox_id: str) -> None:
        self.link.call("cpu", "destroy_sandbox", sandbox_id)

    def exec(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        cancel: threading.Event | None = None,
        **kwargs: Any,
    ) -> ExecResult:
        """As ``CpuManager.exec``; a lost node is an outcome (``error``, ``node_lost: ...``),
        never raised, as the manager's own failures are. Live output (``on_output``) does not
        cross the node boundary yet: the output arrives with the result; nor does a
        preemption handle (a demoted action on a Ray node keeps its cores' share), nor a
        memory pause callback (not wired through the actor yet): a remote env keeps its own
        limit for the run, as before memory per action, so nothing dies at a learned grant."""
        kwargs.pop("on_output", None)
        kwargs.pop("handle", None)
        kwargs.pop("on_memory_paused", None)
        kwargs.pop("mem_limit_bytes", None)
        kwargs["numa_millicores"] = _plain(kwargs.get("numa_millicores"))
        return self._action("exec", cancel, sandbox_id, command, **kwargs)

    def run_in_session(
        self, session_id: str, command: str, *, cancel: threading.Event | None = None, **kwargs: Any
    ) -> ExecResult:
        kwargs["numa_millicores"] = _plain(kwargs.get("numa_millicores"))
        return self._action("run_in_session", cancel, session_id, command, **kwargs)

    def _action(
        self, method: str, cancel: threading.Event | None, *args: Any, **kwargs: Any
    ) -> ExecResult:
        try:
            result: ExecResult = self.link.call_cancellable("cpu", method, cancel, *args, **kwargs)
        except NodeLostError as exc:
            return ExecResult(outcome=Outcome.ERROR, exit_code=None, error=str(exc))
        return result

    def grow_memory(self, sandbox_id: str, limit_bytes: int) -> bool:
        return bool(self.link.call("cpu", "grow_memory", sandbox_id, limit_bytes))

    def oom_kill(self, sandbox_id: str) -> bool:
        return bool(self.link.call("cpu", "oom_kill", sandbox_id))

    def write_file(self, sandbox_id: str, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self.link.call("cpu", "write_file", sandbox_id, path, data, mode)

    def read_file(self, sandbox_id: str, path: str, max_bytes: int | None = None) -> bytes:
        return bytes(self.link.call("cpu", "read_file", sandbox_id, path, max_bytes))

    def empty_dirs(self, sandbox_id: str, paths: Sequence[str]) -> tuple[bool, str]:
        ok, why = self.link.call("cpu", "empty_dirs", sandbox_id, list(paths))
        return bool(ok), str(why)

    def open_session(
        self, sandbox_id: str, *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> str:
        return str(
            self.link.call(
                "cpu", "open_session", sandbox_id, env=dict(env) if env else None, cwd=cwd
            )
        )

    def close_session(self, session_id: str) -> None:
        self.link.call("cpu", "close_session", session_id)

    def close(self) -> None:
        """The node's managers are closed with its actor (``RayMembership.aclose``)."""


class RayGpuProxy:
    """``GpuPort`` of a remote node: every call forwarded to its agent actor."""

    def __init__(self, link: NodeLink) -> None:
        assert link.report.device_capacity_bytes is not None
        self.link = link
        self._capacity = list(link.report.device_capacity_bytes)

    def device_capacity_bytes(self) -> list[int]:
        return list(self._capacity)

    def service_info(self, name: str) -> ServiceInfo:
        info: ServiceInfo = self.link.call("gpu", "service_info", name)
        return info

    def footprint_bytes(self, service: str, num_devices: int) -> int:
        return int(self.link.call("gpu", "footprint_bytes", service, num_devices))

    def register(
        self, name: str, handler: str, folder: str | None, module: str | None, kv: Any = None
    ) -> ServiceInfo:
        """Register a service from a ``folder`` on the node, or a ``pkg.mod:factory`` path
        imported there (the controller's host need not have the model's dependencies)."""
        self.link.check()
        info: ServiceInfo = self.link.wait(
            self.link.actor.register_service.remote(name, handler, folder, module, self.link.epoch, kv)
        )
        return info

    def register_folder(self, name: str, path: str | Path, handler: str, kv: Any = None) -> ServiceInfo:
        """``path`` is a folder on the remote node (the same path on every GPU node)."""
        return self.register(name, handler, str(path), None, kv)

    def register_module(self, name: str, factory: Any, handler: str, kv: Any = None) -> ServiceInfo:
        """``factory`` travels pickled (by reference when importable on the node)."""
        info: ServiceInfo = self.link.call("gpu", "register_module", name, factory, handler, kv)
        return info

    def load(self, replica_id: str, service: str, devices: Sequence[int]) -> float:
        return float(self.link.call("gpu", "load", replica_id, service, list(devices)))

    def evict(self, replica_id: str) -> None:
        self.link.call("gpu", "evict", replica_id)

    def run(
        self, replica_id: str, request: Any, on_event: Any = None, cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        """The service's output (a generation arrives whole: ``on_event`` is not called
        across Ray, and ``cancel`` is not forwarded; the action's cancellation still ends
        the wait); one of at least ``hold_min_bytes`` comes back as its
        ``RayHeldOutput`` (a ``runtime.actions.LazyOutput``, which the runner recognises
        before anything reads it as a dict), the bytes left on the node."""
        self.link.check()
        ref = self.link.actor.run_service.remote(
            replica_id, request, self.link.hold_min_bytes, self.link.epoch
        )
        return cast(dict[str, Any], self.link.wait(ref))

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.link.call("gpu", "status")
        return status

    def close(self) -> None:
        """The node's managers are closed with its actor (``RayMembership.aclose``)."""


def _plain(values: Sequence[int] | None) -> list[int] | None:
    """A NUMA split as a plain list: what the core hands over may be a view of its state."""
    return None if values is None else [int(v) for v in values]
