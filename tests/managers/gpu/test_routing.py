"""Multi-device routing with a device shim: on CPU-only machines every device maps to the same
torch device, so each shard is told apart by the arena its bytes live in. Every module call
is logged with its device index; the test requires that every own tensor of the module lies
in that device's arena and every input arrived on that device. A cut inside a module fails.
On a CUDA machine the same test also runs on ``cuda:0`` + ``cpu`` for real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from arl_tangram.managers.gpu import DeviceSpec, GpuManager, GpuManagerConfig, cpu_devices
from arl_tangram.managers.gpu.routing import PlacementError, module_devices

CASES = ["cpu-shim"] + (["cuda+cpu"] if torch.cuda.is_available() else [])


def _devices(case: str) -> list[DeviceSpec]:
    if case == "cuda+cpu":
        return [
            DeviceSpec("cuda:0", "cuda:0", "cuda", 256 << 20),
            DeviceSpec("cpu:1", "cpu", "cpu", 256 << 20),
        ]
    return cpu_devices([128 << 20] * 4)


def _arena_of(manager: GpuManager, tensor: torch.Tensor) -> int | None:
    for index, arena in enumerate(manager._arenas):
        start = arena.buffer.data_ptr()
        if (
            arena.buffer.device == tensor.device
            and start <= tensor.data_ptr() < start + arena.buffer.numel()
        ):
            return index
    return None


def _check_routes(manager: GpuManager, replica_id: str, run: Callable[[], Any]) -> None:
    replica = manager._replicas[replica_id]
    log: list[Any] = []
    replica.set_route_log(log)
    run()
    assert log, "no module was routed"
    module = replica.model.module  # type: ignore[union-attr]
    seen = set()
    for name, index, input_devices in log:
        submodule = module.get_submodule(name)
        own = [
            t
            for t in list(submodule.parameters(False)) + list(submodule.buffers(False))
            if t.numel()
        ]
        arenas = {_arena_of(manager, t) for t in own}
        assert arenas == {replica.devices[index]}, (name, index, arenas)
        device = manager._arenas[replica.devices[index]].device
        assert all(d == device for d in input_devices), (name, input_devices)
        seen.add(index)
    assert seen == set(range(len(replica.devices)))


@pytest.mark.parametrize("case", CASES)
def test_every_module_runs_on_its_own_device(case: str, teacher_folders: list[Path]) -> None:
    devices = _devices(case)
    tokens = {"tokens": [3, 1, 4, 1, 5]}
    with GpuManager(devices, GpuManagerConfig()) as manager:
        manager.register_folder("teacher", teacher_folders[0], "logprobs")
        manager.load("t", "teacher", list(range(len(devices))))
        manager.load("t1", "teacher", [0])
        _check_routes(manager, "t", lambda: manager.run("t", tokens))
        torch.testing.assert_close(
            torch.tensor(manager.run("t", tokens)["token_logprobs"][1:]),
            torch.tensor(manager.run("t1", tokens)["token_logprobs"][1:]),
        )
        manager.check_invariants()


@pytest.mark.parametrize("case", CASES)
def test_every_bert_module_runs_on_its_own_device(case: str, minilm: Path) -> None:
    """BERT: modules that own tensors and have children (embeddings' position_ids)."""
    devices = _devices(case)
    request = {"input": ["routing across devices", "one more"]}
    with GpuManager(devices, GpuManagerConfig()) as manager:
        manager.register_folder("minilm", minilm, "embed")
        manager.load("m", "minilm", list(range(len(devices))))
        manager.load("m1", "minilm", [0])
        _check_routes(manager, "m", lambda: manager.run("m", request))
        split, whole = manager.run("m", request), manager.run("m1", request)
        for a, b in zip(split["data"], whole["data"], strict=True):
            torch.testing.assert_close(torch.tensor(a["embedding"]), torch.tensor(b["embedding"]))
        manager.check_invariants()


def test_a_cut_inside_a_module_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    linear = model[0]
    good = {id(linear.weight): 0, id(linear.bias): 0, id(model[1].weight): 1, id(model[1].bias): 1}
    assert module_devices(model, good) == {"0": 0, "1": 1}
    bad = dict(good)
    bad[id(linear.bias)] = 1
    with pytest.raises(PlacementError, match="'0'"):
        module_devices(model, bad)
