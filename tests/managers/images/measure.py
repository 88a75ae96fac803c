"""Figures for the image store (not a test; run by hand, prints JSON):

    PYTHONPATH=src python -m tests.managers.images.measure [--dir DIR]

- unpack MiB/s of one realistic layer (host files: /usr/lib/python3.11 and /usr/bin) through
  ``streams.unpack_blob`` beside ``tar -x`` of the same blob, gzip and uncompressed,
  interleaved, median of 3 each;
- a pull of that layer from a loopback docker-registry through ``ImageStore.pull``;
- store bytes (``du`` of the store) for 10 images sharing that base, each with its own
  5 MiB task layer, over the sum of their unpacked sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from arl_tangram.managers.images import ImageStore, ImageStoreConfig, RegistryCredentials
from arl_tangram.managers.images.streams import unpack_blob
from tests.managers.images.builders import LayerTar, compress, write_oci_layout
from tests.managers.images.registry_fixture import Registry

MIB = 1 << 20


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def unpack_vs_tar(work: Path, tar_bytes: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind in ("none", "gzip"):
        blob = work / f"layer.{kind}"
        blob.write_bytes(compress(tar_bytes, kind))
        ours, theirs = [], []
        for i in range(3):
            dest = work / f"ours-{kind}-{i}"
            dest.mkdir()
            with open(blob, "rb") as f:
                ours.append(_time(lambda f=f, dest=dest: unpack_blob(f, dest, "measure")))
            dest2 = work / f"tar-{kind}-{i}"
            dest2.mkdir()
            theirs.append(_time(lambda dest2=dest2, blob=blob: subprocess.run(
                ["tar", "-C", str(dest2), "--numeric-owner", "-xf", str(blob)], check=True)))
            shutil.rmtree(dest)
            shutil.rmtree(dest2)
        mib = len(tar_bytes) / MIB
        out[f"unpack_mb_per_s_{kind}"] = round(mib / statistics.median(ours), 1)
        out[f"tar_x_mb_per_s_{kind}"] = round(mib / statistics.median(theirs), 1)
    return out


def pull_from_registry(work: Path, tar_bytes: bytes) -> dict[str, float]:
    reg = Registry(work / "registry")
    try:
        write_oci_layout(work / "oci", [tar_bytes], tag="base")
        ref = reg.push(work / "oci", "bench/base", "base")
        store = ImageStore(ImageStoreConfig(store_path=work / "pull-store",
                                            registries=(RegistryCredentials(reg.host, insecure=True),)))
        try:
            seconds = _time(lambda: store.pull(ref))
        finally:
            store.close()
        return {"pull_unpack_s": round(seconds, 2), "pull_unpack_mb_per_s": round(len(tar_bytes) / MIB / seconds, 1)}
    finally:
        reg.stop()


def store_ratio(work: Path, base: bytes) -> dict[str, float]:
    store = ImageStore(ImageStoreConfig(store_path=work / "ratio-store"))
    total = 0
    for i in range(10):
        task = LayerTar().dir("testbed").file(f"testbed/blob{i}", os.urandom(5 * MIB)).build()
        write_oci_layout(work / f"task{i}", [base, task], compression="gzip")
        total += store.import_path(work / f"task{i}", f"bench/task:{i}").size_bytes
        shutil.rmtree(work / f"task{i}")
    used = int(subprocess.run(["du", "-sb", str(work / "ratio-store")], capture_output=True, text=True,
                              check=True).stdout.split()[0])
    store.close()
    return {"store_bytes": used, "images_bytes": total, "store_bytes_ratio": round(used / total, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=None, help="where to work (default: a temp dir on /tmp's disk)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="store-measure-", dir=args.dir))
    try:
        src = work / "src"
        src.mkdir()
        subprocess.run(["cp", "-a", "/usr/lib/python3.11", "/usr/bin", str(src)], check=True)
        tar_bytes = subprocess.run(["tar", "-C", str(src), "--numeric-owner", "--sort=name", "-cf", "-", "."],
                                   capture_output=True, check=True).stdout
        shutil.rmtree(src)
        report: dict[str, float] = {"layer_mib": round(len(tar_bytes) / MIB, 1)}
        report.update(unpack_vs_tar(work, tar_bytes))
        report.update(pull_from_registry(work, tar_bytes))
        report.update(store_ratio(work, tar_bytes))
        print(json.dumps(report, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
