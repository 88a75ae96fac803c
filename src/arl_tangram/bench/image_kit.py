"""Shell: the images ``bench images`` measures on, built offline and served from 127.0.0.1.

- The base: a Debian bookworm root with python3 (``mmdebstrap --variant=minbase``; it
  reaches Debian's package mirror once, and the tar is cached under ``~/.cache/arl-tangram``
  and reused), or with ``--quick`` a small root copied from the host's own files.
- Task layers: a repo at ``/testbed`` with a failing test and an incompressible filler file
  (a SWE task's checkout), one per image, all over the one shared base.
- One OCI layout holding every image (the base blob compressed once, shared), pushed with
  ``skopeo`` to a ``docker-registry`` on 127.0.0.1 whose access log counts blob fetches.
Nothing here touches a public image registry.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

CACHE_DIR = Path.home() / ".cache" / "arl-tangram"
DEBIAN_BASE = CACHE_DIR / "debian-bookworm-python3.tar"
MMDEBSTRAP = ("mmdebstrap", "--variant=minbase", "--include=python3", "--format=tar", "bookworm")
CALC = "def add(a, b):\n    return a - b\n"
TEST = "import calc\nassert calc.add(2, 3) == 5, 'add is wrong'\nprint('ok')\n"
FIXED = "def add(a, b):\n    return a + b\n"
IMAGE_CONFIG = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/testbed"}
HOST_BINS = ("bash", "sh", "cat", "ls", "true", "env", "id", "mkdir", "rm", "cp", "python3")
_PY_SKIP = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "turtledemo", "__pycache__"}
GZ = "application/vnd.oci.image.layer.v1.tar+gzip"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _tar(tree: Path, dest: Path) -> Path:
    cmd = ["tar", "-C", str(tree), "--numeric-owner", "--owner=0", "--group=0", "--sort=name", "-cf", str(dest), "."]
    subprocess.run(cmd, check=True, capture_output=True)
    return dest


def copy_host_root(root: Path, bins: Sequence[str]) -> None:
    """A merged-/usr root at ``root`` (which must not exist) from the host's files: ``bins``
    with the libraries ``ldd`` names, python3's stdlib less tests and tools, the usual links,
    and empty /etc, /root, /tmp (the bench's quick base and the tests' image trees)."""
    (root / "usr/bin").mkdir(parents=True)
    libs: set[str] = set()
    for name in bins:
        src = "/usr/bin/python3" if name == "python3" else shutil.which(name)
        assert src is not None, name
        shutil.copy2(os.path.realpath(src), root / "usr/bin" / name)
        out = subprocess.run(["ldd", src], capture_output=True, text=True, check=False).stdout
        libs |= {w for line in out.splitlines() for w in line.split() if w.startswith("/")}
    for lib in sorted(libs):
        dst = root / ("usr" + lib if not lib.startswith("/usr/") else lib.lstrip("/"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dst)
    shutil.copytree("/usr/lib/python3.11", root / "usr/lib/python3.11", symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _PY_SKIP or n.startswith("config-")])  # fmt: skip
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
        os.symlink(target, root / link)
    for d in ("etc", "root", "tmp"):
        (root / d).mkdir()


def debian_base_tar() -> Path:
    """The cached mmdebstrap root (built on first use: minutes, and Debian's mirror)."""
    if DEBIAN_BASE.exists():
        return DEBIAN_BASE
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = DEBIAN_BASE.with_suffix(".tar.partial")
    subprocess.run([*MMDEBSTRAP, str(partial)], check=True, capture_output=True, timeout=3600)
    partial.rename(DEBIAN_BASE)  # only a complete build is ever reused
    return DEBIAN_BASE


def host_base_tar(work: Path) -> Path:
    """A small root from the host's files: a shell, a few tools, python3 with a trimmed stdlib."""
    root = work / "host-base"
    copy_host_root(root, HOST_BINS)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")
    return _tar(root, work / "host-base.tar")


def task_tar(work: Path, index: int, filler_bytes: int) -> Path:
    """Task ``index``'s layer: /testbed with a failing test, and ``filler_bytes`` of seeded noise."""
    root = work / f"task-{index}"
    (root / "testbed").mkdir(parents=True)
    (root / "testbed/calc.py").write_text(CALC)
    (root / "testbed/test_calc.py").write_text(TEST)
    (root / "testbed/data.bin").write_bytes(random.Random(index).randbytes(filler_bytes))
    return _tar(root, work / f"task-{index}.tar")


@dataclass(frozen=True)
class Blob:
    diff_id: str  # sha256 of the tar
    digest: str  # sha256 of the gzipped blob
    size: int  # compressed bytes
    path: Path  # the blob in the layout


class Layout:
    """An OCI image layout at ``root``: layers gzipped once each, images added by tag."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs_dir = root / "blobs" / "sha256"
        self.blobs_dir.mkdir(parents=True)
        self.manifests: list[dict[str, object]] = []
        self._layers: dict[Path, Blob] = {}

    def _put(self, data: bytes) -> tuple[str, int]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (self.blobs_dir / digest.split(":")[1]).write_bytes(data)
        return digest, len(data)

    def layer(self, tar: Path) -> Blob:
        if tar not in self._layers:
            tmp = self.blobs_dir / "incoming.gz"
            with open(tmp, "wb") as out:
                subprocess.run(["gzip", "-1", "-n", "-c", str(tar)], stdout=out, check=True)
            digest = sha256_file(tmp)
            path = self.blobs_dir / digest.split(":")[1]
            tmp.rename(path)
            self._layers[tar] = Blob(sha256_file(tar), digest, path.stat().st_size, path)
        return self._layers[tar]

    def add_image(self, tag: str, tars: list[Path]) -> list[Blob]:
        blobs = [self.layer(t) for t in tars]
        config = {"architecture": "amd64", "os": "linux", "config": IMAGE_CONFIG,
                  "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in blobs]}}  # fmt: skip
        cfg_digest, cfg_size = self._put(json.dumps(config).encode())
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": cfg_size},
                    "layers": [{"mediaType": GZ, "digest": b.digest, "size": b.size} for b in blobs]}  # fmt: skip
        digest, size = self._put(json.dumps(manifest).encode())
        self.manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
                               "annotations": {"org.opencontainers.image.ref.name": tag}})  # fmt: skip
        (self.root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": self.manifests}))
        (self.root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        return blobs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopbackRegistry:
    """A ``docker-registry`` on 127.0.0.1 with its storage and access log under ``work``
    (the bench's and the tests' one registry); ``htpasswd=(user, password)`` turns on basic
    auth. ``stop()`` ends it (by its PID)."""

    def __init__(self, work: Path, htpasswd: tuple[str, str] | None = None) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.host = f"127.0.0.1:{free_port()}"
        self.log_path = work / "registry.log"
        self.auth = htpasswd
        (work / "config.yml").write_text(
            f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {work / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n{_auth_config(work, htpasswd)}")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(["docker-registry", "serve", str(work / "config.yml")], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://{self.host}/v2/", timeout=1, trust_env=False)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("docker-registry did not start") from None
                time.sleep(0.05)

    def push(self, layout: Path, tag: str, name: str = "bench/swe") -> str:
        ref = f"{self.host}/{name}:{tag}"
        cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.auth:
            cmd.append(f"--dest-creds={self.auth[0]}:{self.auth[1]}")
        subprocess.run([*cmd, f"oci:{layout}:{tag}", f"docker://{ref}"], check=True, capture_output=True, timeout=600)
        return ref

    def blob_gets(self) -> Counter[str]:
        """Blob GETs answered 200, by digest, from the access log (manifests are not blobs)."""
        text = self.log_path.read_text(errors="replace")
        return Counter(re.findall(r'"GET /v2/[^"]*/blobs/(sha256:[0-9a-f]{64}) HTTP/1\.1" 200', text))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def _auth_config(work: Path, htpasswd: tuple[str, str] | None) -> str:
    """The registry's ``auth`` block for basic auth over an htpasswd file (bcrypt), or none."""
    if htpasswd is None:
        return ""
    import crypt  # deprecated in 3.11 but present; only tests with basic auth need it

    user, password = htpasswd
    (work / "htpasswd").write_text(f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))}\n")
    return f"auth:\n  htpasswd:\n    realm: test\n    path: {work / 'htpasswd'}\n"
