"""Shell: local image sources for ``ImageStore.import_path``: an OCI image layout directory
(or tar), a ``docker save`` tarball (the legacy ``manifest.json`` form and the OCI form
Docker 25+ writes, which has both), and a plain root filesystem (a directory or a tar,
possibly gzip/zstd compressed) that becomes a one-layer image.

A source only describes the image: layers are opened lazily, one at a time, and every
layer goes through the same hostile-safe, digest-verifying unpack as a registry pull.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from arl_tangram.managers.images import manifest as mf
from arl_tangram.managers.images.errors import ImageError
from arl_tangram.managers.images.reference import DIGEST_RE

Opener = Callable[[], AbstractContextManager[BinaryIO]]


@dataclass(frozen=True)
class LayerSource:
    """One layer to unpack: ``diff_id`` None means "known only after unpacking" (a rootfs)."""

    label: str
    open: Opener
    blob_digest: str | None
    declared_bytes: int | None
    diff_id: str | None


@dataclass(frozen=True)
class SourceImage:
    """An image to install. ``config_bytes`` None: synthesise a config from the diff_ids."""

    config: mf.RawConfig | None
    config_bytes: bytes | None
    layers: tuple[LayerSource, ...]
    references: tuple[str, ...]


class _Files:
    """Read access to named files of a layout (a directory or a tar's members)."""

    def __init__(self, root: Path | None = None, tar: tarfile.TarFile | None = None) -> None:
        self._root, self._tar = root, tar
        self._names = set(tar.getnames()) if tar is not None else None

    def has(self, name: str) -> bool:
        if self._names is not None:
            return name in self._names or f"./{name}" in self._names
        return (self._root / name).is_file()  # type: ignore[operator]

    def size(self, name: str) -> int:
        if self._tar is not None:
            return self._member(name).size
        return os.path.getsize(self._root / name)  # type: ignore[operator]

    def read(self, name: str, limit: int = mf.MAX_JSON_BYTES) -> bytes:
        with self.open(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ImageError("image", f"{name}: larger than {limit} bytes")
        return data

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[BinaryIO]:
        if self._tar is not None:
            f = self._tar.extractfile(self._member(name))
            if f is None:
                raise ImageError("image", f"{name}: not a file in the archive")
            with f:
                yield f  # type: ignore[misc]
        else:
            with open(self._root / name, "rb") as g:  # type: ignore[operator]
                yield g

    def _member(self, name: str) -> tarfile.TarInfo:
        assert self._tar is not None
        for candidate in (name, f"./{name}"):
            with contextlib.suppress(KeyError):
                return self._tar.getmember(candidate)
        raise ImageError("image", f"{name}: missing from the archive")


@contextlib.contextmanager
def open_source(path: Path, reference: str | None) -> Iterator[SourceImage]:
    """Describe the image at ``path`` (kind told apart by content); the layers stay openable
    until the context exits."""
    path = Path(path)
    if path.is_dir():
        files = _Files(root=path)
        if files.has("oci-layout") and files.has("index.json"):
            yield _oci_layout(files, reference)
        else:
            yield _rootfs(_tar_of_dir(path), f"rootfs dir {path}", reference)
        return
    if not path.is_file():
        raise ImageError("image", f"{path}: no such file or directory to import")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic.startswith(b"\x1f\x8b") or magic == b"\x28\xb5\x2f\xfd":
        yield _rootfs(_file_opener(path), f"rootfs tar {path}", reference)
        return
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 (closed by the with below)
    except tarfile.TarError as exc:
        raise ImageError("image", f"{path}: not a tar, an OCI layout or a directory: {exc}") from None
    with tar:
        files = _Files(tar=tar)
        if files.has("manifest.json"):
            yield _docker_save(files, reference)
        elif files.has("oci-layout") and files.has("index.json"):
            yield _oci_layout(files, reference)
        else:
            yield _rootfs(_file_opener(path), f"rootfs tar {path}", reference)


def _blob_name(digest: str) -> str:
    if not DIGEST_RE.match(digest):
        raise ImageError("image", f"blob digest must be sha256:<64 hex> (got {digest!r})")
    return "blobs/sha256/" + digest.split(":", 1)[1]


def _oci_layout(files: _Files, reference: str | None) -> SourceImage:
    entries = mf.parse_index(files.read("index.json"), "index.json")
    tag = reference.rsplit(":", 1)[-1] if reference and "@" not in reference else None
    named = [e for e in entries if e.ref_name is not None and e.ref_name in (reference, tag)]
    if len(named) == 1 or len(entries) == 1:
        entry = named[0] if named else entries[0]
    else:
        raise ImageError("image", f"OCI layout holds {len(entries)} images: name one by its ref.name annotation", reference)
    while entry.media_type in mf.INDEX_TYPES:
        entry = mf.select_platform(mf.parse_index(_verified(files, entry), entry.digest), entry.digest)
    manifest = mf.parse_manifest(_verified(files, entry), entry.digest)
    config_bytes = _verified(files, manifest.config)
    config = mf.parse_config(config_bytes, manifest.config.digest)
    _same_count(config, len(manifest.layers), entry.digest)
    layers = tuple(
        LayerSource(desc.digest, _member_opener(files, _blob_name(desc.digest)), desc.digest, desc.size, diff)
        for desc, diff in zip(manifest.layers, config.diff_ids, strict=True))
    return SourceImage(config, config_bytes, layers, (reference,) if reference else ())


def _verified(files: _Files, desc: mf.Descriptor) -> bytes:
    data = files.read(_blob_name(desc.digest))
    mf.verify(data, desc.digest, f"blob {desc.digest}")
    return data


def _docker_save(files: _Files, reference: str | None) -> SourceImage:
    try:
        entries = json.loads(files.read("manifest.json"))
    except ValueError as exc:
        raise ImageError("image", f"manifest.json: not valid JSON: {exc}") from None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ImageError("image", "manifest.json: must be a non-empty list of images")
    chosen = [e for e in entries if reference and reference in (e.get("RepoTags") or [])]
    if not chosen and len(entries) > 1:
        raise ImageError("image", f"docker save tar holds {len(entries)} images: name one of its RepoTags", reference)
    entry = chosen[0] if chosen else entries[0]
    config_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or not isinstance(layer_names, list):
        raise ImageError("image", "manifest.json: an entry needs Config and Layers")
    config_bytes = files.read(config_name)
    config = mf.parse_config(config_bytes, config_name)
    _same_count(config, len(layer_names), "manifest.json")
    layers = []
    for name, diff in zip(layer_names, config.diff_ids, strict=True):
        blob = "sha256:" + name.rsplit("/", 1)[1] if str(name).startswith("blobs/sha256/") else None
        layers.append(LayerSource(f"{diff} ({name})", _member_opener(files, str(name)), blob, files.size(str(name)), diff))
    refs = tuple(r for r in entry.get("RepoTags") or [] if isinstance(r, str))
    return SourceImage(config, config_bytes, tuple(layers), tuple(dict.fromkeys(((reference,) if reference else ()) + refs)))


def _same_count(config: mf.RawConfig, num_layers: int, what: str) -> None:
    if len(config.diff_ids) != num_layers:
        raise ImageError("image", f"{what}: {num_layers} layers but {len(config.diff_ids)} diff_ids in the config")


def _rootfs(opener: Opener, label: str, reference: str | None) -> SourceImage:
    return SourceImage(None, None, (LayerSource(label, opener, None, None, None),), (reference,) if reference else ())


def _member_opener(files: _Files, name: str) -> Opener:
    return lambda: files.open(name)


def _file_opener(path: Path) -> Opener:
    return lambda: open(path, "rb")


def _tar_of_dir(root: Path) -> Opener:
    """A rootfs directory as a tar stream from GNU tar (sorted, numeric ids, user xattrs)."""
    @contextlib.contextmanager
    def opener() -> Iterator[BinaryIO]:
        tar = shutil.which("tar") or "tar"
        cmd = [tar, "-C", str(root), "--numeric-owner", "--sort=name", "--xattrs", "--xattrs-include=user.*",
               "-cf", "-", "."]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            yield proc.stdout  # type: ignore[misc]
        finally:
            proc.stdout.close()
            err = proc.stderr.read() if proc.stderr else b""
            if proc.stderr:
                proc.stderr.close()
            proc.wait()
        if proc.returncode != 0:  # reached only when the unpack itself succeeded
            raise ImageError("image", f"{root}: tar of the rootfs failed: {err.decode(errors='replace')[-300:]}")
    return opener
