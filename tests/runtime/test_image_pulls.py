"""Pulls through the live controller and executor: envs of one image share one pull, a
failed pull ends each waiting creation with the layer and the registry's answer, prefetch
warms a node once. The node's store is a small in-test stand-in (the store is not the thing
under test here: the controller, core and executor are; the real store's own tests and the
integrated suite cover it)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.config import TangramConfig
from arl_tangram.runtime.controller import EnvFailedError
from arl_tangram.runtime.embedded import EmbeddedRuntime

pytestmark = pytest.mark.anyio
DIGEST = "sha256:" + "ab" * 32
GOOD, BAD = "127.0.0.1:5999/swe/good:1", "127.0.0.1:5999/swe/bad:1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RegistryRefused(Exception):
    field = "layer"


@dataclass(frozen=True)
class _Layer:
    digest: str
    unpacked_bytes: int
    path: Path


@dataclass(frozen=True)
class _Record:
    image_id: str
    references: tuple[str, ...]
    layers: tuple[_Layer, ...]
    size_bytes: int
    config: Any = None


@dataclass
class StandInStore:
    """Answers pulls after a short delay: ``GOOD`` lands, ``BAD`` is refused."""

    pulls: dict[str, int] = field(default_factory=dict)
    held: dict[str, _Record] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pull(self, reference: str, progress: Any = None) -> _Record:
        with self.lock:
            self.pulls[reference] = self.pulls.get(reference, 0) + 1
        time.sleep(0.2)
        if reference == BAD:
            raise RegistryRefused(f"layer {DIGEST}: registry 127.0.0.1:5999 answered 401 Unauthorized")
        record = _Record("sha256:" + "cd" * 32, (reference,), (_Layer(DIGEST, 5 << 20, Path("/nonexistent")),), 5 << 20)
        self.held[reference] = record
        return record

    def lookup(self, reference_or_id: str) -> _Record | None:
        return self.held.get(reference_or_id)

    def layer_bytes(self) -> dict[str, int]:
        return {layer.digest: layer.unpacked_bytes for r in self.held.values() for layer in r.layers}

    def pin(self, image_id: str, holder_id: str) -> None: ...

    def unpin(self, holder_id: str) -> None: ...


async def _runtime(store: StandInStore | None) -> EmbeddedRuntime:
    runtime = await EmbeddedRuntime.start(TangramConfig())
    runtime.agent.images = store  # type: ignore[assignment]
    return runtime


async def test_envs_of_one_failing_image_share_one_pull_and_its_cause() -> None:
    store = StandInStore()
    runtime = await _runtime(store)
    try:
        from arl_tangram.core.env_spec import EnvSpec

        specs = [EnvSpec(f"bad-{i}", 64 << 20, image=BAD) for i in range(16)]
        results = await asyncio.gather(*(runtime.controller.create_env(s) for s in specs), return_exceptions=True)
        assert store.pulls == {BAD: 1}
        for result in results:
            assert isinstance(result, EnvFailedError)
            assert DIGEST in str(result) and "401" in str(result) and "image_pull_failed" in str(result)
        assert not runtime.controller.loop.state.envs and not runtime.controller.loop.state.pulls
    finally:
        await runtime.aclose()


async def test_prefetch_pulls_once_and_the_core_learns_the_layers() -> None:
    store = StandInStore()
    runtime = await _runtime(store)
    try:
        controller = runtime.controller
        node = runtime.agent.cpu_node_id
        controller.prefetch(GOOD)
        for _ in range(100):
            if DIGEST in controller.loop.state.node_layers.get(node, {}):
                break
            await asyncio.sleep(0.05)
        assert controller.loop.state.node_layers[node] == {DIGEST: 5 << 20}
        assert controller.loop.state.image_layers[GOOD][0].digest == DIGEST
        controller.prefetch(GOOD)  # the node holds its layers now: no second pull
        await asyncio.sleep(0.3)
        assert store.pulls == {GOOD: 1}
    finally:
        await runtime.aclose()


async def test_an_image_env_without_any_store_names_the_field() -> None:
    runtime = await _runtime(None)
    try:
        from arl_tangram.core.env_spec import EnvSpec

        with pytest.raises(SpecError, match="image: needs a node with an image store"):
            await runtime.controller.create_env(EnvSpec("e", 64 << 20, image=GOOD))
        with pytest.raises(SpecError, match="image: must be"):
            EnvSpec("e", 64 << 20, image="Not A Reference")
    finally:
        await runtime.aclose()
