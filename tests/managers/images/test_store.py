"""The image store on local sources: OCI layouts, docker-save tars, rootfs dirs and tars;
layer sharing, User resolution, removal, pins and GC, quotas, and recovery after kill -9."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from arl_tangram.managers.images import (
    UID_SHIFT,
    ImageError,
    ImageNotFoundError,
    ImageRefError,
    LayerRefusedError,
    image_root_inputs,
)
from tests.managers.images.builders import LayerTar, host_rootfs, sha, tar_of, write_oci_layout

BASE = LayerTar().dir("etc").file("etc/passwd", b"root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/h:/bin/sh\n") \
    .file("etc/group", b"root:x:0:\napp:x:1001:\nstaff:x:50:\n").file("etc/os-release", b"base").build()


def task_layer(i: int, size: int = 1000) -> bytes:
    return LayerTar().dir("testbed").file(f"testbed/task{i}.py", os.urandom(size)).build()


def test_oci_layout_import_shares_the_base_layer(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    ids = []
    for i in range(3):
        cfg = {"Env": ["PATH=/bin", f"TASK={i}"], "WorkingDir": "/testbed", "User": "app"}
        ids.append(write_oci_layout(tmp_path / f"oci{i}", [BASE, task_layer(i)], config=cfg))
        store.import_path(tmp_path / f"oci{i}", f"127.0.0.1:1/task:{i}")
    assert len(store.layer_bytes()) == 4  # one base + three task layers
    assert len(os.listdir(tmp_path / "store" / "layers")) == 4
    rec = store.lookup("127.0.0.1:1/task:2")
    assert rec is not None and rec.image_id == ids[2] and store.lookup(ids[2]) == rec
    lowers, env, wd, uid, gid = image_root_inputs(rec)
    assert lowers[0] == rec.layers[0].path and rec.layers[0].digest == sha(BASE)
    assert (lowers[1] / "testbed" / "task2.py").exists()
    assert env == (("PATH", "/bin"), ("TASK", "2")) and wd == "/testbed" and (uid, gid) == (1000, 1001)
    assert rec.size_bytes == sum(x.unpacked_bytes for x in rec.layers)
    assert os.stat(tmp_path / "store").st_mode & 0o777 == 0o700


@pytest.mark.parametrize("user,ids", [("", (0, 0)), ("app", (1000, 1001)), ("app:staff", (1000, 50)),
                                      ("1000", (1000, 1001)), ("1234:7", (1234, 7))])
def test_user_resolves_against_the_image_files(make_store, tmp_path: Path, user: str, ids) -> None:  # type: ignore[no-untyped-def]
    write_oci_layout(tmp_path / "oci", [BASE], config={"User": user})
    rec = make_store().import_path(tmp_path / "oci", "u:1")
    assert (rec.config.uid, rec.config.gid) == ids and rec.config.user == user


def test_user_missing_from_the_image_passwd_is_an_import_error(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_oci_layout(tmp_path / "oci", [BASE], config={"User": "nobody-here"})
    store = make_store()
    with pytest.raises(ImageError, match="'nobody-here' is not in the image's /etc/passwd") as info:
        store.import_path(tmp_path / "oci", "u:1")
    assert info.value.field == "user"
    assert store.list_images() == [] and store.lookup("u:1") is None


def test_whited_out_passwd_hides_the_lower_one(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_oci_layout(tmp_path / "oci", [BASE, LayerTar().file("etc/.wh.passwd").build()], config={"User": "app"})
    with pytest.raises(ImageError, match="not in the image's /etc/passwd"):
        make_store().import_path(tmp_path / "oci", "u:1")


def _docker_save(tmp_path: Path, layers: list[bytes], oci_form: bool) -> Path:
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": {"WorkingDir": "/w"},
                      "rootfs": {"type": "layers", "diff_ids": [sha(x) for x in layers]}}).encode()
    names = [f"blobs/sha256/{sha(x)[7:]}" if oci_form else f"{sha(x)[7:]}/layer.tar" for x in layers]
    cfg_name = f"blobs/sha256/{sha(cfg)[7:]}" if oci_form else f"{sha(cfg)[7:]}.json"
    files = {cfg_name: cfg, "manifest.json": json.dumps([{"Config": cfg_name, "RepoTags": ["saved:v1"],
                                                          "Layers": names}]).encode()}
    files.update(dict(zip(names, layers, strict=True)))
    out = tmp_path / "save.tar"
    with tarfile.open(out, "w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out


@pytest.mark.parametrize("oci_form", [False, True])
def test_docker_save_tar_imports_both_forms(make_store, tmp_path: Path, oci_form: bool) -> None:  # type: ignore[no-untyped-def]
    rec = make_store().import_path(_docker_save(tmp_path, [BASE, task_layer(1)], oci_form))
    assert rec.references == ("saved:v1",) and rec.config.working_dir == "/w"
    assert len(rec.layers) == 2 and rec.layers[0].digest == sha(BASE)
    assert (rec.layers[1].path / "testbed" / "task1.py").exists()


def test_oci_archive_tar_and_compressed_rootfs_tar_import(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    image_id = write_oci_layout(tmp_path / "oci", [BASE, task_layer(2)], tag="v2")
    subprocess.run(["tar", "-C", str(tmp_path / "oci"), "-cf", str(tmp_path / "oci.tar"), "."], check=True)
    store = make_store()
    assert store.import_path(tmp_path / "oci.tar", "arch:v2").image_id == image_id
    tree = host_rootfs(tmp_path / "rootfs")
    subprocess.run(["tar", "-C", str(tree), "-czf", str(tmp_path / "rootfs.tgz"), "."], check=True)
    rec = store.import_path(tmp_path / "rootfs.tgz", "gz:1")
    assert (rec.layers[0].path / "bin" / "cat").exists() and (rec.config.uid, rec.config.gid) == (0, 0)


def test_docker_save_with_a_tampered_layer_is_refused(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _docker_save(tmp_path, [BASE], oci_form=False)
    data = path.read_bytes().replace(b"os-release", b"os-releasX")
    path.write_bytes(data)
    store = make_store()
    with pytest.raises(LayerRefusedError, match="diff_id mismatch") as info:
        store.import_path(path)
    assert sha(BASE) in str(info.value)
    assert store.layer_bytes() == {} and os.listdir(tmp_path / "store" / "tmp") == []


def test_rootfs_dir_and_tar_import(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tree = host_rootfs(tmp_path / "rootfs")
    store = make_store()
    a = store.import_path(tree, "rootfs:dir")
    (tmp_path / "rootfs.tar").write_bytes(tar_of(tree))
    b = store.import_path(tmp_path / "rootfs.tar", "rootfs:tar")
    assert len(a.layers) == 1 and (a.layers[0].path / "bin" / "sh").exists()
    assert os.stat(a.layers[0].path / "bin" / "sh").st_uid == UID_SHIFT
    assert b.layers[0].digest == sha(tar_of(tree))
    assert a.image_id.startswith("sha256:") and store.lookup("rootfs:tar") == b


def test_bad_input_names_the_field(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    for bad, rule in [("host", "names the host root"), ("UPPER/Case", "name must be lowercase"),
                      ("a:b:c", "tag must match|name must"), ("x@sha256:12", "digest must be")]:
        with pytest.raises(ImageRefError, match=rule) as info:
            store.lookup(bad)
        assert info.value.field == "image"
    with pytest.raises(ImageRefError, match="none is configured"):
        store.pull("busybox:latest")
    with pytest.raises(ImageNotFoundError):
        store.remove("sha256:" + "0" * 64)
    with pytest.raises(ImageError, match="no such file"):
        store.import_path(tmp_path / "missing")


def test_room_is_made_lru_first_and_never_from_pinned_layers(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store(max_store_bytes=10 << 20)
    recs = []
    for i in range(3):
        write_oci_layout(tmp_path / f"oci{i}", [BASE, task_layer(i, 2 << 20)])
        recs.append(store.import_path(tmp_path / f"oci{i}", f"t:{i}"))
        time.sleep(0.01)  # distinct LRU stamps
    store.pin(recs[0].image_id, "env-1")
    for i in range(3):
        store.remove(f"t:{i}")
    assert store.gc() == []  # under the limit: unreferenced layers stay cached
    write_oci_layout(tmp_path / "big", [LayerTar().file("big", os.urandom(5 << 20)).build()])
    store.import_path(tmp_path / "big", "big:1")  # needs room: the LRU unpinned layer goes
    present = store.layer_bytes()
    assert all(x.digest in present for x in recs[0].layers)  # pinned, though the oldest
    assert recs[1].layers[1].digest not in present and recs[2].layers[1].digest in present
    assert sum(present.values()) <= 10 << 20


def test_pinned_layers_survive_until_unpinned(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store(max_store_bytes=3 << 20)
    write_oci_layout(tmp_path / "oci", [task_layer(1, 2 << 20)])
    rec = store.import_path(tmp_path / "oci", "t:1")
    store.pin(rec.image_id, "env-7")
    store.remove(rec.image_id)
    write_oci_layout(tmp_path / "oci2", [task_layer(2, 2 << 20)])
    with pytest.raises(LayerRefusedError, match="store quota"):
        store.import_path(tmp_path / "oci2", "t:2")
    assert store.gc() == [] and rec.layers[0].path.exists()
    store.unpin("env-7")
    store.import_path(tmp_path / "oci2", "t:2")
    assert not rec.layers[0].path.exists() and rec.layers[0].digest not in store.layer_bytes()


def test_image_larger_than_the_store_quota_is_refused_and_leaves_nothing(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store(max_store_bytes=1 << 20)
    write_oci_layout(tmp_path / "oci", [LayerTar().file("big", os.urandom(3 << 20)).build()])
    with pytest.raises(LayerRefusedError, match="store quota max_store_bytes=1048576"):
        store.import_path(tmp_path / "oci", "big:1")
    assert store.layer_bytes() == {} and os.listdir(tmp_path / "store" / "tmp") == []
    assert os.listdir(tmp_path / "store" / "layers") == []


def test_per_layer_cap_is_enforced(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store(max_layer_bytes=1 << 20)
    write_oci_layout(tmp_path / "oci", [LayerTar().file("big", bytes(8 << 20)).build()])
    with pytest.raises(LayerRefusedError, match="per-layer cap of 1048576"):
        store.import_path(tmp_path / "oci", "big:1")


KILLER = """
import sys
from pathlib import Path
from arl_tangram.managers.images import ImageStore, ImageStoreConfig
ImageStore(ImageStoreConfig(store_path=Path(sys.argv[1]))).import_path(Path(sys.argv[2]), "big:1")
"""


def test_kill_9_during_unpack_leaves_nothing_after_reopen(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    members = LayerTar()
    for i in range(2000):
        members.file(f"d{i % 50}/f{i}", os.urandom(10_000))
    write_oci_layout(tmp_path / "oci", [members.build()], compression="gzip")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path / "store"), str(tmp_path / "oci")], env=env)
    tmp_dir = tmp_path / "store" / "tmp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_dir.exists() and any(tmp_dir.iterdir())):
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert any(tmp_dir.iterdir()), "the unpack was not caught mid-way"
    store = make_store()
    assert list(tmp_dir.iterdir()) == [] and store.layer_bytes() == {} and store.list_images() == []


def test_pull_of_an_image_id_answers_from_the_store(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    image_id = write_oci_layout(tmp_path / "oci", [BASE])
    with pytest.raises(ImageNotFoundError, match="names no registry"):
        store.pull(image_id)
    rec = store.import_path(tmp_path / "oci")
    assert store.pull(image_id) == rec and rec.references == ()


def test_reopen_drops_layer_dirs_the_index_does_not_know(make_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store()
    write_oci_layout(tmp_path / "oci", [BASE])
    rec = store.import_path(tmp_path / "oci", "keep:1")
    stray = tmp_path / "store" / "layers" / ("ab" * 32)  # renamed into place, then killed before the index
    (stray / "etc").mkdir(parents=True)
    reopened = make_store()
    assert not stray.exists() and reopened.lookup("keep:1") == rec and rec.layers[0].path.exists()
