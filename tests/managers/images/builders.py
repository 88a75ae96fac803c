"""Test builders: layer tars made in memory (hostile ones included), OCI image layouts
written from them, and small rootfs trees copied from host files."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class LayerTar:
    """A tar built member by member; ``build()`` returns its bytes."""

    members: list[tuple[tarfile.TarInfo, bytes]] = field(default_factory=list)

    def _info(self, name: str, kind: bytes, mode: int, uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, 1700000000
        return info

    def dir(self, name: str, mode: int = 0o755, **kw: int) -> LayerTar:
        self.members.append((self._info(name, tarfile.DIRTYPE, mode, **kw), b""))
        return self

    def file(self, name: str, data: bytes = b"x", mode: int = 0o644, pax: dict[str, str] | None = None,
             **kw: int) -> LayerTar:
        info = self._info(name, tarfile.REGTYPE, mode, **kw)
        info.size = len(data)
        if pax:
            info.pax_headers = dict(pax)
        self.members.append((info, data))
        return self

    def symlink(self, name: str, target: str) -> LayerTar:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.members.append((info, b""))
        return self

    def hardlink(self, name: str, target: str) -> LayerTar:
        info = self._info(name, tarfile.LNKTYPE, 0o644)
        info.linkname = target
        self.members.append((info, b""))
        return self

    def device(self, name: str, kind: bytes = tarfile.CHRTYPE, major: int = 1, minor: int = 3) -> LayerTar:
        info = self._info(name, kind, 0o666)
        info.devmajor, info.devminor = major, minor
        self.members.append((info, b""))
        return self

    def build(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for info, data in self.members:
                tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
        return buf.getvalue()


def compress(data: bytes, kind: str) -> bytes:
    if kind == "gzip":
        return gzip.compress(data, compresslevel=1, mtime=0)
    if kind == "zstd":
        return subprocess.run(["zstd", "-q", "-1", "-c"], input=data, capture_output=True, check=True).stdout
    return data


MEDIA = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip", "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
         "none": "application/vnd.oci.image.layer.v1.tar"}


def write_oci_layout(dest: Path, layers: list[bytes], tag: str = "latest", compression: str = "gzip",
                     config: dict | None = None) -> str:
    """An OCI image layout at ``dest`` holding one image; returns its image id (config digest)."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = sha(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return digest

    descs = []
    for tar in layers:
        blob = compress(tar, compression)
        descs.append({"mediaType": MEDIA[compression], "digest": put(blob), "size": len(blob)})
    cfg = {"architecture": "amd64", "os": "linux", "config": config or {},
           "rootfs": {"type": "layers", "diff_ids": [sha(t) for t in layers]}}
    cfg_bytes = json.dumps(cfg).encode()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(cfg_bytes),
                           "size": len(cfg_bytes)}, "layers": descs}
    man_bytes = json.dumps(manifest).encode()
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": put(man_bytes), "size": len(man_bytes), "platform": {"os": "linux", "architecture": "amd64"},
             "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    (dest / "index.json").write_text(json.dumps(index))
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return sha(cfg_bytes)


def host_rootfs(dest: Path, with_python: bool = False) -> Path:
    """A tiny root filesystem from host files: a shell, coreutils' ls/cat, passwd/group."""
    for sub in ("bin", "etc", "tmp", "lib", "lib64", "testbed"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    for tool in ("sh", "ls", "cat", "true"):
        src = shutil.which(tool)
        assert src is not None
        shutil.copy2(src, dest / "bin" / tool)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")
    (dest / "etc" / "group").write_text("root:x:0:\napp:x:1001:\nstaff:x:50:\n")
    if with_python:
        shutil.copytree("/usr/lib/python3.11/json", dest / "lib" / "python-json")
    return dest


def tar_of(tree: Path) -> bytes:
    return subprocess.run(["tar", "-C", str(tree), "--numeric-owner", "--sort=name", "-cf", "-", "."],
                          capture_output=True, check=True).stdout
