"""Many concurrent requests across more services than fit (the standalone wrapper places and
evicts; the mechanism loads, runs and evicts concurrently): none lost, none mixed."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from arl_tangram.managers.gpu import StandaloneGpuManager


def _reference(manager: StandaloneGpuManager, name: str, tokens: list[int]) -> list[float]:
    """Log-probs computed alone (batch of one), to compare each concurrent answer with."""
    return manager.call_sync(name, {"tokens": tokens})["token_logprobs"][1:]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_concurrent_calls_across_more_teachers_than_fit(
    make_standalone: Callable[..., StandaloneGpuManager],
    teacher_folders: list[Path],
    teacher_footprint: int,
    num_workers: int,
) -> None:
    budget = 2 * teacher_footprint  # two of five teachers fit at once
    manager = make_standalone([budget], batch_window_s=0.003 * num_workers)
    names = [f"teacher{i}" for i in range(len(teacher_folders))]
    for name, folder in zip(names, teacher_folders, strict=True):
        manager.register_folder(name, folder, "logprobs")
    rng = random.Random(7)
    work = [
        (rng.choice(names), [rng.randrange(4096) for _ in range(rng.randint(2, 24))])
        for _ in range(80)
    ]

    async def run_all() -> list[dict]:
        async def one(name: str, tokens: list[int]) -> dict:
            await asyncio.sleep(rng.random() * 0.02)
            return await manager.call(name, {"tokens": tokens})

        return list(await asyncio.gather(*(one(n, t) for n, t in work)))

    results = asyncio.run(run_all())
    assert len(results) == len(work)
    for (name, tokens), result in zip(work, results, strict=True):
        assert result["tokens"] == tokens
        torch.testing.assert_close(
            torch.tensor(result["token_logprobs"][1:]),
            torch.tensor(_reference(manager, name, tokens)),
            rtol=0,
            atol=1e-4,
        )
    status = manager.status()
    assert sum(manager.num_evictions.values()) > 0
    assert len(status["devices"][0]["replicas"]) <= 2


def test_threads_calling_sync_in_parallel(
    make_standalone: Callable[..., StandaloneGpuManager],
    teacher_folders: list[Path],
    teacher_footprint: int,
) -> None:
    budget = 2 * teacher_footprint
    manager = make_standalone([budget])
    for i, folder in enumerate(teacher_folders[:3]):
        manager.register_folder(f"t{i}", folder, "logprobs")
    expected = {i: manager.call_sync(f"t{i}", {"tokens": [1, 2, 3, i + 4]}) for i in range(3)}
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(15):
                i = rng.randrange(3)
                got = manager.call_sync(f"t{i}", {"tokens": [1, 2, 3, i + 4]})
                assert got["tokens"] == expected[i]["tokens"]
                # the same model on the same tokens: equal up to float noise (torch's CPU
                # kernels split reductions by the threads free at the time: ~1e-6 apart);
                # another teacher's answer, or a half-swapped one, is off by far more
                torch.testing.assert_close(
                    torch.tensor(got["token_logprobs"][1:]), torch.tensor(expected[i]["token_logprobs"][1:]), rtol=0, atol=1e-4
                )
        except BaseException as exc:  # surfaced below; a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors


def test_a_resident_service_answers_while_another_loads(
    make_standalone: Callable[..., StandaloneGpuManager],
    teacher_folders: list[Path],
    teacher_footprint: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wrapper never loads under its policy lock: with another service's load held up
    (the mechanism's ``load`` waits on an event), a call to a resident service completes."""
    manager = make_standalone([2 * teacher_footprint])
    manager.register_folder("resident", teacher_folders[0], "logprobs")
    manager.register_folder("incoming", teacher_folders[1], "logprobs")
    request = {"tokens": [1, 2, 3]}
    expected = manager.call_sync("resident", request)
    entered, release = threading.Event(), threading.Event()
    real_load = manager.manager.load

    def held_load(replica_id: str, service: str, devices: list[int]) -> float:
        entered.set()
        assert release.wait(60), "the held load was never released"
        return real_load(replica_id, service, devices)

    monkeypatch.setattr(manager.manager, "load", held_load)
    loaded: dict[str, object] = {}
    loader = threading.Thread(target=lambda: loaded.update(r=manager.call_sync("incoming", request)))
    answered: dict[str, object] = {}
    caller = threading.Thread(target=lambda: answered.update(r=manager.call_sync("resident", request)))
    loader.start()
    try:
        assert entered.wait(30), "the incoming service's load never began"
        caller.start()
        caller.join(10)
        assert answered.get("r") == expected, "a resident call waited for another service's load"
    finally:
        release.set()
        loader.join(60)
        if caller.ident is not None:
            caller.join(60)
    assert "r" in loaded and manager.num_loads["incoming"] == 1
