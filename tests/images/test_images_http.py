"""``/v1/images`` and ``POST /v1/envs {"image"}`` over real HTTP, with the real store pulling
from a docker-registry on 127.0.0.1: a pull ahead of need (202, then listed with its node),
an env on it, an import of a server path (only when the operator allows it), removal, and
4xx answers naming the field."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.client.conftest import serving
from tests.images.kit import CALC, ImageKit

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]


async def _listed(http: httpx.AsyncClient, reference: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for image in (await http.get("/v1/images")).json()["images"]:
            if reference in image["references"]:
                return dict(image)
        await asyncio.sleep(0.1)
    raise AssertionError(f"{reference} never landed")


async def test_images_routes_and_an_env_on_a_pulled_image(image_kit: ImageKit, tmp_path: Path) -> None:
    with serving(image_kit.config(tmp_path / "store", allow_import_paths=True)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            assert (await http.get("/v1/images")).json() == {"images": []}
            r = await http.post("/v1/images", json={"reference": image_kit.reference})
            assert r.status_code == 202 and r.json()["status"] == "pulling", r.text
            image = await _listed(http, image_kit.reference)
            assert image["nodes"] == ["local/cpu"] and len(image["layers"]) == 2
            assert image["size_bytes"] == sum(layer["size_bytes"] for layer in image["layers"]) > 0
            r = await http.post("/v1/envs", json={"image": image_kit.reference, "memory": "128MiB"})
            assert r.status_code == 201, r.text
            env = r.json()["env_id"]
            got = await http.get(f"/v1/envs/{env}/files", params={"path": "/testbed/calc.py"})
            assert got.status_code == 200 and got.content == CALC.encode()
            run = await http.post("/v1/actions", json={"type": "exec", "env_id": env, "command": "pwd"}, params={"wait_s": 30})
            assert run.json()["result"]["stdout"] == "/testbed\n"
            imported = await http.post("/v1/images", json={"path": str(image_kit.layout)})
            assert imported.status_code == 202 and imported.json()["image_id"] == image["image_id"], imported.text
            assert (await http.delete(f"/v1/images/{image_kit.reference}")).status_code == 204
            assert all(image_kit.reference not in i["references"] for i in (await http.get("/v1/images")).json()["images"])
            missing = await http.delete(f"/v1/images/{image_kit.registry.host}/swe/none:v1")
            assert missing.status_code == 404
            assert (await http.delete(f"/v1/envs/{env}")).status_code == 204


async def test_images_routes_refuse_bad_input_naming_the_field(image_kit: ImageKit, tmp_path: Path) -> None:
    with serving(image_kit.config(tmp_path / "store")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            bad = await http.post("/v1/images", json={"reference": "Bad Ref"})
            assert 400 <= bad.status_code < 500 and bad.json()["field"] == "reference", bad.text
            node = await http.post("/v1/images", json={"reference": image_kit.reference, "nodes": ["elsewhere"]})
            assert 400 <= node.status_code < 500 and node.json()["field"] == "nodes", node.text
            path = await http.post("/v1/images", json={"path": str(image_kit.layout)})
            assert path.status_code == 403 and "allow_import_paths" in path.text
            env = await http.post("/v1/envs", json={"image": f"{image_kit.registry.host}/swe/missing:v1", "memory": "128MiB"})
            assert 400 <= env.status_code < 600 and "404" in env.text and "image" in env.text, env.text


async def test_a_server_without_an_image_store_lists_none_and_refuses_pulls_409() -> None:
    with serving() as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            assert (await http.get("/v1/images")).json() == {"images": []}
            pull = await http.post("/v1/images", json={"reference": "127.0.0.1:5000/swe/x:1"})
            assert pull.status_code == 409 and pull.json()["field"] == "image" and "[images]" in pull.json()["rule"], pull.text
            assert (await http.delete("/v1/images/127.0.0.1:5000/swe/x:1")).status_code == 404
