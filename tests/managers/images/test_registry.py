"""Pulls from a real docker-registry on 127.0.0.1 (images pushed with skopeo from layouts
the tests build): anonymous, basic and bearer auth, indexes, verification of what the
registry serves, errors that name the registry's answer, and concurrency (64 pulls of one
image fetch each blob once; GC during pulls never takes a layer in use)."""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from arl_tangram.managers.images import (
    ImageError,
    ImageNotFoundError,
    ImageStore,
    LayerRefusedError,
    RegistryCredentials,
    RegistryError,
)
from tests.managers.images.builders import LayerTar, sha, write_oci_layout
from tests.managers.images.registry_fixture import Registry, free_port
from tests.managers.images.token_proxy import TokenProxy

pytestmark = pytest.mark.skipif(not (shutil.which("docker-registry") and shutil.which("skopeo")),
                                reason="needs docker-registry and skopeo")

BASE = LayerTar().dir("etc").file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n").file("usr/lib/base", os.urandom(300_000)).build()


@functools.cache
def layer(i: int) -> bytes:
    return LayerTar().dir("testbed").file(f"testbed/t{i}", random.Random(i).randbytes(50_000)).build()


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "registry")
    yield reg
    reg.stop()


def creds(host: str, **kw) -> tuple[RegistryCredentials, ...]:  # type: ignore[no-untyped-def]
    return (RegistryCredentials(host, insecure=True, **kw),)


def push(reg: Registry, tmp_path: Path, name: str, layers: list[bytes], tag: str = "v1") -> str:
    write_oci_layout(tmp_path / f"oci-{name}-{tag}", layers, tag=tag)
    return reg.push(tmp_path / f"oci-{name}-{tag}", name, tag)


def test_anonymous_pull_with_progress(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ref = push(registry, tmp_path, "team/app", [BASE, layer(1)])
    store: ImageStore = make_store(registries=creds(registry.host))
    seen = []
    rec = store.pull(ref, progress=seen.append)
    assert [x.digest for x in rec.layers] == [sha(BASE), sha(layer(1))]
    assert (rec.layers[1].path / "testbed" / "t1").stat().st_size == 50_000
    assert {p.phase for p in seen} >= {"fetch", "unpack", "done"}
    again = store.pull(ref, progress=seen.append)
    assert again == rec and seen[-2].phase == "cached"
    assert store.lookup(ref) == rec


def test_64_concurrent_pulls_fetch_each_blob_once(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ref = push(registry, tmp_path, "burst", [BASE, layer(1), layer(2)])
    before = registry.blob_gets()
    store = make_store(registries=creds(registry.host))
    barrier = threading.Barrier(64)

    def pull(_: int):  # type: ignore[no-untyped-def]
        barrier.wait()
        return store.pull(ref)

    with ThreadPoolExecutor(64) as pool:
        records = list(pool.map(pull, range(64)))
    assert all(r == records[0] for r in records)
    fetched = registry.blob_gets() - before
    layer_counts = [n for digest, n in fetched.items() if digest != records[0].image_id]
    assert len(layer_counts) == 3 and set(layer_counts) == {1}, fetched
    assert fetched[records[0].image_id] == 1  # the config blob, once too


def test_images_sharing_a_base_pulled_together_fetch_the_base_once(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    refs = [push(registry, tmp_path, f"task{i}", [BASE, layer(i)]) for i in range(8)]
    before = registry.blob_gets()
    store = make_store(registries=creds(registry.host), max_concurrent_pulls=2)
    with ThreadPoolExecutor(8) as pool:
        records = list(pool.map(store.pull, refs))
    fetched = registry.blob_gets() - before
    assert len(store.layer_bytes()) == 9
    base_blob = [d for d, n in fetched.items() if n > 1]
    assert base_blob == [], fetched  # every blob (the shared base too) fetched once
    assert len({r.layers[0].path for r in records}) == 1


def test_basic_auth_and_bad_credentials(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reg = Registry(tmp_path / "auth-registry", htpasswd=("alice", "s3cret-pw"))
    try:
        ref = push(reg, tmp_path, "private", [layer(1)])
        rec = make_store(registries=creds(reg.host, username="alice", password="s3cret-pw")).pull(ref)
        assert rec.layers
        with pytest.raises(RegistryError, match="answered 401") as info:
            make_store(store_path=tmp_path / "s2", registries=creds(reg.host, username="alice", password="wrong-pw")).pull(ref)
        assert info.value.field == "registry" and info.value.status == 401
        assert "wrong-pw" not in str(info.value)
        with pytest.raises(RegistryError, match="needs credentials, none configured"):
            make_store(store_path=tmp_path / "s3", registries=creds(reg.host)).pull(ref)
    finally:
        reg.stop()


def test_bearer_token_auth(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ref = push(registry, tmp_path, "tok/app", [BASE, layer(3)])
    proxy = TokenProxy(registry.host, "bob", "pw-123")
    try:
        via = ref.replace(registry.host, proxy.host)
        monkey_env = {"TANGRAM_TEST_PW": "pw-123"}
        os.environ.update(monkey_env)
        try:
            rec = make_store(registries=creds(proxy.host, username="bob", password_env="TANGRAM_TEST_PW")).pull(via)
        finally:
            del os.environ["TANGRAM_TEST_PW"]
        assert [x.digest for x in rec.layers] == [sha(BASE), sha(layer(3))]
        assert proxy.token_requests == 1  # the token is cached for the scope
        with pytest.raises(RegistryError, match="token server answered 401"):
            make_store(store_path=tmp_path / "s2", registries=creds(proxy.host, username="bob", password="no")).pull(via)
    finally:
        proxy.stop()


def _put_index(reg: Registry, name: str, entries: list[tuple[str, str]]) -> str:
    manifests = []
    for tag, arch in entries:
        r = httpx.get(f"http://{reg.host}/v2/{name}/manifests/{tag}", trust_env=False,
                      headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(r.content),
                          "size": len(r.content), "platform": {"os": "linux", "architecture": arch}})
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                       "manifests": manifests}).encode()
    r = httpx.put(f"http://{reg.host}/v2/{name}/manifests/multi", content=body, trust_env=False,
                  headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
    assert r.status_code == 201, r.text
    return f"{reg.host}/{name}:multi"


def test_index_resolves_to_linux_amd64_or_says_it_has_none(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    push(registry, tmp_path, "multi", [layer(10)], tag="arm")
    push(registry, tmp_path, "multi", [layer(11)], tag="amd")
    ref = _put_index(registry, "multi", [("arm", "arm64"), ("amd", "amd64")])
    rec = make_store(registries=creds(registry.host)).pull(ref)
    assert rec.layers[0].digest == sha(layer(11))
    arm_only = _put_index(registry, "multi", [("arm", "arm64")])
    with pytest.raises(ImageError, match=r"index has no linux/amd64 manifest \(has: linux/arm64\)"):
        make_store(store_path=tmp_path / "s2", registries=creds(registry.host)).pull(arm_only)


def _blob_file(reg: Registry, digest: str) -> Path:
    hexd = digest.split(":")[1]
    return reg.log_path.parent / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


@pytest.mark.parametrize("damage,rule", [("flip", "digest mismatch"), ("cut", "truncated")])
def test_tampered_or_truncated_blob_from_the_registry_is_refused(make_store, registry: Registry, tmp_path: Path,
                                                                 damage: str, rule: str) -> None:
    ref = push(registry, tmp_path, "bad", [layer(20)])
    index = json.loads((tmp_path / "oci-bad-v1" / "index.json").read_text())
    man = json.loads((tmp_path / "oci-bad-v1" / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]).read_text())
    blob_digest = man["layers"][0]["digest"]
    path = _blob_file(registry, blob_digest)
    data = path.read_bytes()
    path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:] if damage == "flip" else data[: len(data) // 2])
    store = make_store(registries=creds(registry.host))
    with pytest.raises(LayerRefusedError, match=rule) as info:
        store.pull(ref)
    assert sha(layer(20)) in str(info.value)
    assert store.layer_bytes() == {} and list((tmp_path / "store" / "tmp").iterdir()) == []


def test_unknown_image_unreachable_registry_and_bare_names(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store(registries=creds(registry.host), default_registry=registry.host)
    with pytest.raises(ImageNotFoundError, match="answered 404"):
        store.pull(f"{registry.host}/nope:v1")
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RegistryError, match=f"{dead} unreachable") as info:
        make_store(store_path=tmp_path / "s2", registries=creds(dead)).pull(f"{dead}/x:1")
    assert info.value.field == "registry"
    push(registry, tmp_path, "bare", [layer(30)])
    assert store.pull("bare:v1").references == (f"{registry.host}/bare:v1",)


def test_gc_during_pulls_never_removes_a_layer_in_use(make_store, registry: Registry, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    refs = [push(registry, tmp_path, f"gc{i}", [BASE, layer(40 + i)]) for i in range(6)]
    junk = [push(registry, tmp_path, f"junk{i}", [layer(60 + i)]) for i in range(6)]
    store = make_store(registries=creds(registry.host), max_store_bytes=2 << 20)
    for ref in junk:
        store.pull(ref)
        store.remove(ref)  # unreferenced: fair game for GC
    stop = threading.Event()
    removed: list[str] = []

    def collect() -> None:
        while not stop.is_set():
            removed.extend(store.gc())

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            records = list(pool.map(store.pull, refs))
    finally:
        stop.set()
        collector.join()
    for rec in records:
        assert all(x.path.exists() for x in rec.layers)
        assert all(x.digest in store.layer_bytes() for x in rec.layers)
    in_use = {x.digest for r in records for x in r.layers}
    assert not in_use & set(removed)


def test_layers_of_a_pull_in_flight_survive_the_most_aggressive_gc(make_store, registry: Registry,
                                                                   tmp_path: Path) -> None:
    ref = push(registry, tmp_path, "inflight", [BASE, layer(50), layer(51)])
    store = make_store(registries=creds(registry.host))
    removed: list[str] = []

    def on_progress(p) -> None:  # type: ignore[no-untyped-def]
        if p.phase == "done":  # a layer is unpacked; the image is not committed yet
            removed.extend(store.gc(target_bytes=0))

    rec = store.pull(ref, progress=on_progress)
    assert removed == []
    assert all(x.path.exists() and x.digest in store.layer_bytes() for x in rec.layers)
    store.remove(ref)
    assert sorted(store.gc(target_bytes=0)) == sorted(x.digest for x in rec.layers)
