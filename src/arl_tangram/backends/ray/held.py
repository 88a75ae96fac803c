"""Shell: large outputs by reference on the Ray backend: what an agent keeps in its node's
object store instead of sending it to the controller.

Who calls: the agent actor (``hold_streams``, ``hold_value``) on the node, right after the
manager returns; the controller's readers (``RayHeldOutput.resolve``, through
``runtime.actions.read_result``) on a worker thread. An output of at least ``min_bytes`` is
``ray.put`` by the agent, which owns it; the controller's record keeps only the reference
(Ray's borrowing keeps the object alive while the record holds it, and frees it when the
record is forgotten). If the agent dies first, the object is lost with it and resolving
raises: the reader gets an empty field and a ``cause`` naming the loss
(``ActionResult.resolved``).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field, fields
from typing import Any

from arl_tangram.managers.cpu.results import ExecResult

DEFAULT_HOLD_MIN_BYTES = 256 << 10  # smaller outputs travel with the result: a put costs more
RESOLVE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RayHeldOutput:
    """A ``runtime.actions.LazyOutput``: an object in a node's object store."""

    ref: Any  # ray.ObjectRef
    size_bytes: int

    def resolve(self) -> Any:
        """The output (bytes of a stream, or a service's value); blocking. Raises Ray's
        error when the object is gone (its owner, the node's agent, died)."""
        import ray

        return ray.get(self.ref, timeout=RESOLVE_TIMEOUT_S)


@dataclass(frozen=True)
class HeldExecResult(ExecResult):
    """An ``ExecResult`` whose large streams stayed on the node: they are empty here and
    ``held_outputs`` maps their names (``stdout``, ``stderr``) to references."""

    held_outputs: dict[str, RayHeldOutput] = field(default_factory=dict)


def hold_streams(result: ExecResult, min_bytes: int | None) -> ExecResult:
    """``result`` with each stream of at least ``min_bytes`` put in the object store (on
    the agent); ``min_bytes`` None: unchanged (everything travels by value)."""
    if min_bytes is None:
        return result
    held = {
        name: data
        for name, data in (("stdout", result.stdout), ("stderr", result.stderr))
        if len(data) >= min_bytes
    }
    if not held:
        return result
    import ray

    refs = {name: RayHeldOutput(ray.put(data), len(data)) for name, data in held.items()}
    values: dict[str, Any] = {f.name: getattr(result, f.name) for f in fields(result)}
    values.update({name: b"" for name in held})  # the bytes stay here
    return HeldExecResult(**values, held_outputs=refs)


def hold_value(value: Any, min_bytes: int | None) -> Any:
    """``value`` (a service's output), or a ``RayHeldOutput`` of it when its pickled size
    is at least ``min_bytes`` (measured here, on the agent: the controller never sees it)."""
    if min_bytes is None:
        return value
    size = len(pickle.dumps(value, protocol=5))
    if size < min_bytes:
        return value
    import ray

    return RayHeldOutput(ray.put(value), size)
