"""An image env end to end with the real parts: a docker-registry on 127.0.0.1 -> the node's
``ImageStore`` (pulled as the core's action) -> ``agent/envs`` -> ``ImageRoot`` -> a real
sandbox whose commands run inside the image. Over the SDK's two transports (in process and
HTTP), plus the raw ``/v1`` routes; a failed pull ends the creation naming the field and the
registry's answer. Nothing is left behind (the suite's fixture)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from arl_tangram.client import SpecError
from arl_tangram.runtime.controller import EnvFailedError
from tests.images.kit import CALC, FIXED, ImageKit
from tests.managers.images.registry_fixture import Registry, free_port

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
Connector = Callable[..., Any]


async def test_an_image_env_runs_inside_the_image_with_its_config(connector: Connector, image_kit: ImageKit) -> None:
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        env = await tg.create_env(image=image_kit.reference, memory="256MiB")
        r = await env.exec("pwd; id -u; echo $TASK; cat /etc/hostname; ls /testbed")
        assert r.ok, r.stderr
        cwd, uid, task, hostname, *files = r.stdout.split()
        # WorkingDir, the image's root user, its Env, its own /etc (not the host's)
        assert (cwd, uid, task, hostname) == ("/testbed", "0", "calc", "image")
        assert sorted(files) == ["calc.py", "test_calc.py"]
        failing = await env.exec("python3 test_calc.py")
        assert failing.outcome == "failed" and "add is wrong" in failing.stderr
        assert (await env.read_file("/testbed/calc.py")) == CALC.encode()
        await env.write_file("/testbed/calc.py", FIXED)  # an absolute path inside the image
        passing = await env.exec("python3 test_calc.py")
        assert passing.ok and passing.stdout.strip() == "ok"
        await env.exec("mkdir -p /usr/local/lib/site && echo pkg > /usr/local/lib/site/p.txt")  # its own upper
        assert (await env.read_file("/usr/local/lib/site/p.txt")) == b"pkg\n"
        other = await tg.create_env(image=image_kit.reference, memory="256MiB")  # layers now on the node
        assert (await other.read_file("/testbed/calc.py")) == CALC.encode()  # uppers are private
        assert not (await other.exec("test -e /usr/local/lib/site/p.txt")).ok
        await other.release()
        await env.release()


async def test_a_host_file_call_on_an_image_resolves_inside_its_root(connector: Connector, image_kit: ImageKit) -> None:
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        env = await tg.create_env(image=image_kit.reference, memory="256MiB")
        assert (await env.exec("ln -s /etc/shadow /testbed/leak && ln -s ../../../../etc/passwd /testbed/up")).ok
        assert b"root:x:0:0:root:/root:/bin/bash" in await env.read_file("/testbed/up")  # the image's passwd
        with pytest.raises(FileNotFoundError):  # no /etc/shadow in the image: the host's is never reached
            await env.read_file("/testbed/leak")
        assert (await env.exec("true")).ok  # the service is fine after the refusal
        await env.release()


async def test_a_failed_pull_ends_the_creation_naming_the_registry_answer(connector: Connector, image_kit: ImageKit) -> None:
    host = image_kit.registry.host
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        with pytest.raises((EnvFailedError, SpecError)) as unknown:
            await tg.create_env(image=f"{host}/swe/missing:v1", memory="128MiB")
        assert "image" in str(unknown.value) and "404" in str(unknown.value)
        dead = f"127.0.0.1:{free_port()}"
        with pytest.raises((EnvFailedError, SpecError)) as unreachable:
            await tg.create_env(image=f"{dead}/swe/calc:v1", memory="128MiB")
        assert "registry" in str(unreachable.value) and dead in str(unreachable.value) and "unreachable" in str(unreachable.value)
        with pytest.raises(SpecError, match="image"):
            await tg.create_env(image="Not/A Reference", memory="128MiB")
        env = await tg.create_env(image=image_kit.reference, memory="128MiB")  # the node still works
        assert (await env.exec("true")).ok
        await env.release()


async def test_bad_credentials_end_the_creation_with_the_registry_401(connector: Connector, image_kit: ImageKit, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(tmp_path / "auth-registry", htpasswd=("ci", "s3cret"))
    try:
        reference = registry.push(image_kit.layout, "swe/calc", "v1")
        monkeypatch.setenv("TEST_REGISTRY_PASSWORD", "wrong")
        kit = ImageKit(registry, reference, image_kit.layout, tmp_path)
        async with connector(kit.config(tmp_path / "store", username="ci", password_env="TEST_REGISTRY_PASSWORD")) as tg:
            with pytest.raises((EnvFailedError, SpecError)) as refused:
                await tg.create_env(image=reference, memory="128MiB")
            text = str(refused.value)
            assert "registry" in text and "401" in text and "wrong" not in text
        monkeypatch.setenv("TEST_REGISTRY_PASSWORD", "s3cret")
        async with connector(kit.config(tmp_path / "store2", username="ci", password_env="TEST_REGISTRY_PASSWORD")) as tg:
            env = await tg.create_env(image=reference, memory="128MiB")
            assert (await env.exec("cat calc.py")).stdout == CALC
            await env.release()
    finally:
        registry.stop()


async def test_a_layer_the_registry_lost_ends_the_creation_naming_that_layer(connector: Connector, image_kit: ImageKit,
                                                                          tmp_path: Path) -> None:
    registry = image_kit.registry
    reference = registry.push(image_kit.layout, "swe/broken", "v1")
    index = json.loads((image_kit.layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((image_kit.layout / "blobs/sha256" / manifest_digest).read_text())
    lost = manifest["layers"][1]["digest"]  # the task layer's blob
    gone = httpx.delete(f"http://{registry.host}/v2/swe/broken/blobs/{lost}", trust_env=False)
    assert gone.status_code == 202, gone.text
    async with connector(image_kit.config(tmp_path / "store")) as tg:
        with pytest.raises((EnvFailedError, SpecError)) as failed:
            await tg.create_env(image=reference, memory="128MiB")
        assert lost in str(failed.value) and "404" in str(failed.value)  # the layer and the registry's answer
