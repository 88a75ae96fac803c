"""Retry after node loss through the live controller and dispatcher (no Ray: two node
agents whose GPU ports are test doubles that block until told, and fail as a Ray proxy does
once their node is declared lost). A retryable service call on the lost node is run again
on the other node and its result says ``attempts == 2``; the lost attempt's late result,
an error or even a success, never becomes the action's; a call not marked retryable ends
``error`` / ``node_lost``. Also: a held output (``LazyOutput``) stays out of the record and
is fetched for the reader."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.action import ActionSpec, Binding, ServiceSpec
from arl_tangram.core.events import NodeLost
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.runtime.actions import ActionRecord, ActionResult, ServicePayload, read_result
from arl_tangram.runtime.controller import Controller

pytestmark = pytest.mark.anyio
SERVICE = ServiceSpec("svc", 1 << 20)


class GatedGpu:
    """A GPU port whose ``run`` blocks until ``gate`` opens; once ``lost`` is set it raises as
    a lost node's proxy does, unless ``answer_late`` (a result that arrives after the loss)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gate = threading.Event()
        self.lost = threading.Event()
        self.answer_late = False
        self.running = 0
        self.output: Any = None

    def device_capacity_bytes(self) -> list[int]:
        return [1 << 30]

    def service_info(self, name: str) -> Any:
        return SimpleNamespace(weight_bytes=SERVICE.weight_bytes)

    def footprint_bytes(self, service: str, num_devices: int) -> int:
        return SERVICE.weight_bytes

    def load(self, replica_id: str, service: str, devices: Sequence[int]) -> float:
        return 0.0

    def evict(self, replica_id: str) -> None: ...

    def run(self, replica_id: str, request: Any, on_event: Any = None, cancel: Any = None) -> Any:
        self.running += 1
        while not self.gate.wait(0.01):
            if self.lost.is_set() and not self.answer_late:
                raise RuntimeError("node_lost: the test declared it lost")
        return self.output if self.output is not None else {"node": self.name, "echo": request}

    def status(self) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...


def _call(action_id: str, *, retryable: bool) -> ActionSpec:
    return ActionSpec(
        action_id, "svc", Binding("service", "svc"), demand_per_unit=ResourceVector(gpu_devices=1),
        key=ResourceKind.GPU, retryable=retryable,
    )  # fmt: skip


async def _until(predicate: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out waiting")


async def _two_nodes() -> tuple[Controller, dict[str, GatedGpu]]:
    gpus = {"a": GatedGpu("a"), "b": GatedGpu("b")}
    agents = [NodeAgent(name, gpu=gpu) for name, gpu in gpus.items()]  # type: ignore[arg-type]
    controller = Controller(Scheduler(make_policy("elastic")), agents, check=True)
    await controller.start()
    controller.register_service(SERVICE)
    return controller, gpus


def _lose(controller: Controller, gpus: dict[str, GatedGpu], record: ActionRecord) -> GatedGpu:
    """Declare the node running ``record`` lost, as the Ray membership does: the node's calls
    start failing, and ``NodeLost`` is posted for it."""
    assert record.node_id is not None
    victim = gpus[record.node_id.split("/")[0]]
    victim.lost.set()
    controller.post(NodeLost(record.node_id))
    return victim


async def test_a_retryable_call_is_retried_on_the_other_node_and_a_late_result_is_dropped() -> None:
    controller, gpus = await _two_nodes()
    try:
        record = controller.submit(_call("c1", retryable=True), ServicePayload("hi"))
        await _until(lambda: record.node_id is not None and any(g.running for g in gpus.values()))
        assert record.node_id is not None
        gpus[
            record.node_id.split("/")[0]
        ].answer_late = True  # it answers, late, after the retry began
        victim = _lose(controller, gpus, record)
        other = next(g for g in gpus.values() if g is not victim)
        await _until(lambda: other.running == 1)  # attempt 2 runs on the other node
        victim.gate.set()  # the lost attempt answers "succeeded" now: not the action's result
        await asyncio.sleep(0.2)
        assert record.result is None and controller.loop.state.running["c1"].attempt == 2
        other.gate.set()
        result = await controller.wait("c1", 5.0)
        assert result.outcome == "succeeded" and result.output["node"] == other.name
        assert result.attempts == 2 and result.node_id == f"{other.name}/gpu"
    finally:
        for g in gpus.values():
            g.gate.set()
        await controller.aclose()


async def test_the_lost_attempts_error_is_not_the_outcome_of_a_retryable_call() -> None:
    """The lost node's proxy fails at once, maybe before the core's round about the loss:
    for a retryable call that failure is not its outcome; for another call it is
    ``error`` / ``node_lost`` either way."""
    controller, gpus = await _two_nodes()
    try:
        keep = controller.submit(_call("keep", retryable=True), ServicePayload(1))
        await _until(
            lambda: keep.node_id is not None and sum(g.running for g in gpus.values()) == 1
        )
        plain = controller.submit(_call("plain", retryable=False), ServicePayload(2))
        await _until(
            lambda: plain.node_id is not None and sum(g.running for g in gpus.values()) == 2
        )
        assert keep.node_id is not None and controller.executor is not None
        victim = gpus[keep.node_id.split("/")[0]]  # the plain one runs on the other node
        # The loss is posted (as membership does) but its round has not run when the node's
        # call fails: the failure reaches the dispatcher first (nothing kicks the loop here).
        lost = NodeLost(keep.node_id)
        controller.loop.post(lost)
        controller.executor.note_posted(lost)
        victim.lost.set()
        await asyncio.sleep(0.3)
        assert keep.result is None  # held back: the core's answer to the loss decided (a retry)
        other = next(g for g in gpus.values() if g is not victim)
        other.gate.set()
        result = await controller.wait("keep", 5.0)
        assert result.outcome == "succeeded" and result.attempts == 2, (
            result.outcome,
            result.cause,
        )
        assert (await controller.wait("plain", 5.0)).outcome == "succeeded"
        lone = controller.submit(_call("lone", retryable=False), ServicePayload(3))
        other.gate.clear()
        await _until(lambda: lone.node_id is not None)
        _lose(controller, gpus, lone)
        ended = await controller.wait("lone", 5.0)
        assert ended.outcome == "error" and (ended.cause or "").startswith("node_lost"), ended.cause
        assert ended.attempts == 1
    finally:
        for g in gpus.values():
            g.gate.set()
        await controller.aclose()


class HeldBytes:
    """A ``LazyOutput`` as a remote backend makes one; counts its fetches."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.size_bytes = len(data) if isinstance(data, bytes) else 1
        self.fetches = 0

    def resolve(self) -> Any:
        self.fetches += 1
        return self.data


async def test_a_held_output_stays_out_of_the_record_and_is_fetched_for_the_reader() -> None:
    controller, gpus = await _two_nodes()
    try:
        held = HeldBytes({"big": "x" * 1000})
        for g in gpus.values():
            g.output, g.gate = held, threading.Event()
            g.gate.set()
        record = controller.submit(_call("h", retryable=False), ServicePayload(None))
        await _until(lambda: record.result is not None)
        assert record.result is not None
        assert record.result.output is None and record.result.held == {"output": held}
        read = await read_result(record)
        assert read.output == {"big": "x" * 1000} and not read.held and held.fetches == 1
        assert record.result.output is None  # the record still holds only the reference
    finally:
        await controller.aclose()


def test_resolving_a_lost_held_stream_leaves_it_empty_and_says_why() -> None:
    class Gone:
        size_bytes = 10

        def resolve(self) -> bytes:
            raise LookupError("its node was lost")

    r = ActionResult(
        "x", "exec", "succeeded", stdout="", held={"stdout": Gone(), "stderr": HeldBytes(b"e\xff")}
    )
    out = r.resolved()
    assert out.stdout == "" and out.stderr == "e\ufffd" and not out.held
    assert out.cause is not None and "stdout: held output of 10 bytes lost" in out.cause
