"""Large JSON bodies (api/json_body.py + api/json_worker.py): parsed by a real worker
process, rebuilt from small frames to exactly what ``json.loads`` gives, under the same
rules as small bodies (valid JSON, nesting depth, key size); frames cannot name classes."""

from __future__ import annotations

import io
import json
import pickle
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from arl_tangram.api import json_body, json_worker
from arl_tangram.api.json_body import JsonWorkers
from arl_tangram.core.errors import SpecError

pytestmark = pytest.mark.anyio


async def chunked(data: bytes, size: int = 65536) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def documents() -> list[Any]:
    rng = random.Random(7)
    big = "".join(rng.choice("ab\"\\é\n\u2603") for _ in range(400_000))
    return [
        {"type": "service", "input": {"texts": ["x" * (1 << 20)] * 5, "n": 3}},
        list(range(200_000)),
        {"a": [{"k": i, "v": [rng.random(), None, True, "s" * (i % 300)]} for i in range(20_000)], "big": big},
        [[big, [big[:1000]] * 500], {"z": {"y": {"x": big}}}],
        "just a string " * 40_000,
        [[[[[[1]]]]]] * 50_000,
    ]


async def test_a_large_body_comes_back_exactly_as_json_loads_gives_it() -> None:
    workers = JsonWorkers(size=2)
    try:
        for doc in documents():
            raw = json.dumps(doc).encode()
            assert len(raw) > json_body.SMALL_BODY_BYTES
            assert await workers.parse(chunked(raw)) == json.loads(raw)
        assert workers.num_parsed == len(documents())
    finally:
        await workers.aclose()


async def test_a_large_body_breaking_a_rule_is_a_spec_error_and_the_worker_goes_on() -> None:
    workers = JsonWorkers(size=1)
    pad = " " * json_body.SMALL_BODY_BYTES
    cases = [
        (pad + "{" + '"a": [1,' * 3, "must be valid JSON"),
        (pad + "[" * 10_000 + "]" * 10_000, "must nest at most 200 levels"),
        (pad + "[" * 201 + "]" * 201, "must nest at most 200 levels"),
        (pad + json.dumps({"k" * (json_worker.PIECE_BYTES + 1): 1}), "object keys must be at most"),
    ]
    try:
        for raw, rule in cases:
            with pytest.raises(SpecError) as info:
                await workers.parse(chunked(raw.encode()))
            assert info.value.field == "body" and rule in info.value.rule, info.value.rule
        assert await workers.parse(chunked((pad + "[" * 200 + "]" * 200).encode())) == json.loads("[" * 200 + "]" * 200)
    finally:
        await workers.aclose()


def test_small_bodies_follow_the_same_rules() -> None:
    assert json_body.parse_small(b"[" * 200 + b"]" * 200) == json.loads("[" * 200 + "]" * 200)
    for raw, rule in ((b"[" * 201 + b"]" * 201, "nest at most"), (b"[" * 9000 + b"]" * 9000, "nest at most"), (b"{", "valid JSON")):
        with pytest.raises(SpecError) as info:
            json_body.parse_small(raw)
        assert info.value.field == "body" and rule in info.value.rule


def test_a_frame_naming_a_class_is_refused() -> None:
    frame = pickle.dumps([("v", json_worker.Refused("x"))])
    with pytest.raises(pickle.UnpicklingError):
        json_body._NoGlobals(io.BytesIO(frame)).load()
