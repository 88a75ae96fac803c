"""Registering model services is an operator's power: over HTTP a tenant may name only the
factories and model folders the operator allowed (``[service] allowed_modules`` /
``allowed_folders``); anything else is a 403 naming the field, with nothing imported, read
or loaded. Allowed ones load on a worker thread, a factory that raises is the caller's
error (422) and the server goes on, a folder's weights load from safetensors only (pickled
weights are refused, never unpickled); the operator's own ``[[services]]`` need no
allowlist."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from arl_tangram.runtime.config import (
    ConfigError,
    GpuConfig,
    ServiceConfig,
    ServiceSettings,
    TangramConfig,
    parse_config,
)
from tests.api.conftest import serving

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
TOKENS = {"tok-a": "alice", "tok-b": "bob"}
TENANT_CODE = "tests.api.tenant_code"


def _client(server: object, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120)  # type: ignore[attr-defined]


async def _register(http: httpx.AsyncClient, **source: str) -> httpx.Response:
    return await http.post("/v1/services", json={"name": "mine", "handler": "logprobs", **source})


async def test_what_the_operator_did_not_allow_is_refused_and_never_imported(tmp_path: Path) -> None:
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    for folder in (models / "empty", elsewhere):
        folder.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")
    (models / "link").symlink_to(elsewhere)
    settings = ServiceSettings(allowed_modules=("tests.api.registrable:build_for_tenants",), allowed_folders=(str(models),))
    assert TENANT_CODE not in sys.modules
    with serving(TangramConfig(service=settings), tokens=TOKENS) as server:
        async with _client(server, "tok-a") as alice:
            for module in (f"{TENANT_CODE}:build", "os:abort", "os:getpid", "tests.api.registrable:build"):
                r = await _register(alice, module=module)
                assert r.status_code == 403 and r.json()["field"] == "module", (module, r.text)
                assert "allowed_modules" in r.json()["rule"]
            for folder in (str(elsewhere), str(models / "link"), f"{models}/../elsewhere", "models/empty"):
                r = await _register(alice, folder=folder)
                assert r.status_code == 403 and r.json()["field"] == "folder", (folder, r.text)
                assert "allowed_folders" in r.json()["rule"]
            # allowed, but not a model folder: the shape rule answers, after the allowlist
            r = await _register(alice, folder=str(models / "empty"))
            assert r.status_code == 422 and "config.json" in r.json()["rule"], r.text
            assert (await alice.get("/v1/health")).json()["status"] == "ok"
            assert (await alice.get("/v1/services")).json()["services"] == []
        assert server.app.state.api.runtime.agent.gpu is None  # nothing was loaded: no GPU manager
    assert TENANT_CODE not in sys.modules  # ... and the tenant's module was never imported


def _pickled_copy(folder: Path, into: Path) -> Path:
    """The model of ``folder`` with its weights pickled (``pytorch_model.bin``), no safetensors."""
    import shutil

    import torch
    from safetensors.torch import load_file

    shutil.copytree(folder, into)
    weights = into / "model.safetensors"
    torch.save(load_file(str(weights)), str(into / "pytorch_model.bin"))
    weights.unlink()
    return into


async def test_allowed_factories_load_the_operators_need_no_allowlist_and_a_broken_one_is_an_error(tmp_path: Path) -> None:
    from arl_tangram.managers.gpu.generated_lm import generate_causal_lm

    models = tmp_path / "models"
    tiny = generate_causal_lm(models, 1 << 20)
    pickled = _pickled_copy(tiny, models / "pickled")
    allowed = ("tests.api.registrable:build_for_tenants", "tests.api.registrable:build_broken")
    config = TangramConfig(
        gpu=GpuConfig(devices=1, device_mem_bytes=64 << 20),
        services=(ServiceConfig("op/tiny", "logprobs", module="tests.api.registrable:build"),),  # not in the allowlist
        service=ServiceSettings(allowed_modules=allowed, allowed_folders=(str(models),)),
    )
    call = {"type": "service", "request": {"tokens": [1, 2, 3]}}
    with serving(config, tokens=TOKENS) as server:
        async with _client(server, "tok-a") as alice, _client(server, "tok-b") as bob:
            shared = (await bob.post("/v1/actions", json={**call, "service": "op/tiny"}, params={"wait_s": 60})).json()
            assert shared["result"]["outcome"] == "succeeded", shared["result"]
            assert (await _register(alice, module="tests.api.registrable:build")).status_code == 403  # the operator's, not a tenant's
            r = await _register(alice, module="tests.api.registrable:build_for_tenants")
            assert r.status_code == 201 and r.json()["shared"] is False, r.text
            mine = (await alice.post("/v1/actions", json={**call, "service": "mine"}, params={"wait_s": 60})).json()
            assert mine["result"]["outcome"] == "succeeded" and len(mine["result"]["output"]["token_logprobs"]) == 3, mine["result"]
            assert (await bob.post("/v1/actions", json={**call, "service": "mine"})).status_code == 404
            broken = await alice.post("/v1/services", json={"name": "broken", "handler": "logprobs", "module": allowed[1]})
            assert broken.status_code == 422 and broken.json()["field"] == "module", broken.text
            assert "broken on purpose" in broken.json()["rule"]
            assert (await bob.get("/v1/health")).json()["status"] == "ok"  # the server went on
            folder = await alice.post("/v1/services", json={"name": "lm", "handler": "logprobs", "folder": str(tiny)})
            assert folder.status_code == 201, folder.text  # a safetensors folder inside an allowed one
            refused = await alice.post("/v1/services", json={"name": "pickle", "handler": "logprobs", "folder": str(pickled)})
            assert refused.status_code == 422 and refused.json()["field"] == "folder", refused.text  # never unpickled
            assert {s["name"] for s in (await alice.get("/v1/services")).json()["services"]} == {"lm", "mine", "op/tiny"}


def test_the_allowlists_are_validated_naming_the_field() -> None:
    ok = parse_config('[service]\nallowed_modules = ["pkg.mod:build"]\nallowed_folders = ["/models"]\n')
    assert ok.service.allowed_modules == ("pkg.mod:build",) and ok.service.allowed_folders == ("/models",)
    assert TangramConfig().service.allowed_modules == () == TangramConfig().service.allowed_folders  # default: nothing
    for text, field in (
        ('allowed_modules = ["os"]', "service.allowed_modules"),
        ('allowed_modules = "pkg.mod:build"', "service.allowed_modules"),
        ('allowed_folders = ["models"]', "service.allowed_folders"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(f"[service]\n{text}\n")
        assert info.value.field == field, text
