"""Shell: the live SWE workload's images: one image per task, every one the shared base
(Debian bookworm + python3, ``image_kit.debian_base_tar``, built offline once and cached;
or, for tests, a small root of the host's files) plus one layer holding the task's repo at
``/testbed``, all in one OCI layout (the base blob compressed once), imported into a node's
image store by reference. Nothing reaches a registry or the network.

Who calls: ``swe.run_async`` (and the tests) once per run, before any system starts; the
layout is cached under ``~/.cache/arl-tangram`` by the content of its layers, so a second run
only imports (each layer digest is unpacked once per store).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arl_tangram.bench.image_kit import CACHE_DIR, DEBIAN_BASE, HOST_BINS, Layout, copy_host_root
from arl_tangram.bench.live.swe_repo import SweTask

REGISTRY_HOST = "127.0.0.1:5000"  # a name only: images are imported from the layout, never pulled
TEST_BINS = (*HOST_BINS, "grep", "sleep")  # what a host-file base needs for the rollouts' commands


@dataclass(frozen=True)
class TaskImages:
    """The layout and each task's image reference in it (``task_id -> reference``)."""

    layout: Path
    references: dict[str, str]


def reference_of(task_id: str) -> str:
    return f"{REGISTRY_HOST}/swe/{task_id}:{task_id}"


def _tar(tree: Path, dest: Path) -> Path:
    cmd = ["tar", "-C", str(tree), "--numeric-owner", "--owner=0", "--group=0", "--sort=name", "--mtime=@0", "-cf", str(dest), "."]
    subprocess.run(cmd, check=True, capture_output=True)
    return dest


def task_layer(task: SweTask, work: Path) -> Path:
    """The task's layer tar: its repo's files at /testbed (world-writable: the sandbox user edits it)."""
    root = work / f"{task.task_id}-tree"
    shutil.rmtree(root, ignore_errors=True)
    for rel, text in sorted(task.files.items()):
        path = root / "testbed" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [root / "testbed", *sorted((root / "testbed").rglob("*"))]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    return _tar(root, work / f"{task.task_id}.tar")


def host_base(work: Path) -> Path:
    """A small python3 root of the host's files (the tests' base: seconds, no mirror)."""
    root = work / "host-base"
    if not (work / "host-base.tar").exists():
        shutil.rmtree(root, ignore_errors=True)
        copy_host_root(root, TEST_BINS)
        (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
        (root / "etc/group").write_text("root:x:0:\n")
        _tar(root, work / "host-base.tar")
    return work / "host-base.tar"


def default_base(cache_dir: Path = CACHE_DIR) -> tuple[Path, str]:
    """(root tar, its name): the cached Debian bookworm + python3 base (``bench images``
    builds it once, from Debian's mirror), else a small root of the host's files, so the
    demo never reaches the network."""
    if DEBIAN_BASE.exists():
        return DEBIAN_BASE, "debian-bookworm-python3"
    work = cache_dir / "swe-host-base"
    work.mkdir(parents=True, exist_ok=True)
    return host_base(work), "host-files-python3"


def _key(base: Path, tasks: Sequence[SweTask]) -> str:
    h = hashlib.sha256(f"{base.resolve()}:{base.stat().st_size}:{base.stat().st_mtime_ns}".encode())
    for task in tasks:
        for rel, text in sorted(task.files.items()):
            h.update(f"{task.task_id}/{rel}\0{text}\0".encode())
    return h.hexdigest()[:16]


def build_layout(base: Path, tasks: Sequence[SweTask], cache_dir: Path = CACHE_DIR) -> TaskImages:
    """The OCI layout of every task's image over ``base`` (a root tar), built once per
    (base, task files) and reused after (the base blob is the slow part: ~200 MB gzipped)."""
    layout = cache_dir / f"swe-layout-{_key(base, tasks)}"
    refs = {t.task_id: reference_of(t.task_id) for t in tasks}
    if (layout / "oci" / "index.json").exists():
        return TaskImages(layout, refs)
    shutil.rmtree(layout, ignore_errors=True)
    partial = layout.with_name(layout.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    work = partial / "work"
    lay = Layout(partial / "oci")
    work.mkdir(parents=True)
    for task in tasks:
        lay.add_image(task.task_id, [base, task_layer(task, work)])
    shutil.rmtree(work)
    partial.rename(layout)  # only a complete layout is reused
    return TaskImages(layout, refs)


def oci_dir(images: TaskImages) -> Path:
    return images.layout / "oci"


def import_all(store: object, images: TaskImages) -> None:
    """Import every task image into ``store`` (a ``managers.images`` store; layers it has
    are not unpacked again)."""
    for ref in sorted(images.references.values()):
        store.import_path(oci_dir(images), ref)  # type: ignore[attr-defined]
