"""Shell: turning a described image (a registry manifest or a local source) into a stored
one: each layer through ``LayerSet`` (shared, single-flight), then the ``User`` resolved
against the image's own files, then one commit. Layers stay held until the commit, so GC
running meanwhile cannot take them; a failure releases them (they are then plain
unreferenced layers GC may reclaim) and leaves no temp dir behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from arl_tangram.managers.images import manifest as mf
from arl_tangram.managers.images.errors import ImageError
from arl_tangram.managers.images.index import IndexedImage
from arl_tangram.managers.images.layers import LayerSet
from arl_tangram.managers.images.model import ImageConfig, ImageRecord, LayerRecord, PullProgress
from arl_tangram.managers.images.reference import ImageReference
from arl_tangram.managers.images.registry import RegistryClient
from arl_tangram.managers.images.sources import LayerSource, SourceImage
from arl_tangram.managers.images.streams import IterReader, unpack_blob
from arl_tangram.managers.images.userdb import resolve_user

Progress = Callable[[PullProgress], None]


class Installer:
    """Installs images into one store's layers; ``commit`` publishes the finished image."""

    def __init__(self, layers: LayerSet, commit: Callable[[IndexedImage], ImageRecord],
                 canonical: Callable[[str], str | None]) -> None:
        self._layers = layers
        self._commit = commit
        self._canonical = canonical  # a source's own names (RepoTags) as the store indexes them

    def pull(self, client: RegistryClient, ref: ImageReference, progress: Progress | None) -> ImageRecord:
        resolved = client.resolve(ref)
        what = f"{client.host}/{ref.repository}:{ref.manifest_ref}"
        config = mf.parse_config(resolved.config_bytes, f"{what} config")
        layers = resolved.manifest.layers
        if len(config.diff_ids) != len(layers):
            raise ImageError("image", f"{what}: {len(layers)} layers but {len(config.diff_ids)} diff_ids")
        sources = tuple(
            LayerSource(f"layer {diff} of {what}", _blob_opener(client, ref.repository, desc.digest),
                        desc.digest, desc.size, diff)
            for desc, diff in zip(layers, config.diff_ids, strict=True))
        source = SourceImage(config, resolved.config_bytes, sources, ())
        return self.install(source, ref.canonical(), what, progress)

    def install(self, source: SourceImage, reference: str | None, label: str,
                progress: Progress | None = None) -> ImageRecord:
        held: list[str] = []
        try:
            records = [self._layer(layer, reference or label, held, progress) for layer in source.layers]
            config_bytes = source.config_bytes or _synth_config([r.digest for r in records])
            raw = source.config or mf.parse_config(config_bytes, label)
            uid, gid = resolve_user(raw.user, [r.path for r in records], label)
            named = tuple(c for c in map(self._canonical, source.references) if c is not None)
            refs = tuple(dict.fromkeys(((reference,) if reference else ()) + named))
            config = ImageConfig(raw.env, raw.working_dir, raw.user, uid, gid)
            image = IndexedImage(mf.sha256_digest(config_bytes), refs, tuple(r.digest for r in records), config)
            return self._commit(image)
        finally:
            self._layers.release(held)

    def _layer(self, layer: LayerSource, reference: str, held: list[str], progress: Progress | None) -> LayerRecord:
        def report(phase: str, done: int, total: int | None) -> None:
            if progress is not None:
                progress(PullProgress(reference, layer.diff_id or layer.label, phase, done, total))

        def unpack(dest: Path, charge: Callable[[int], None]):  # type: ignore[no-untyped-def]
            fetched = [0]

            def on_fetched(n: int) -> None:
                fetched[0] += n
                report("fetch", fetched[0], layer.declared_bytes)

            with layer.open() as raw:
                result = unpack_blob(raw, dest, layer.label, declared_bytes=layer.declared_bytes,
                                     blob_digest=layer.blob_digest, diff_id=layer.diff_id,
                                     charge_unpacked=charge, on_fetched=on_fetched)
            report("unpack", result.unpacked_bytes, result.unpacked_bytes)
            return result

        if layer.diff_id is None:
            record = self._layers.unpack_unknown(layer.label, unpack)
            held.append(record.digest)
        else:
            held.append(layer.diff_id)  # ensure() holds on entry, success or not
            record = self._layers.ensure(layer.diff_id, layer.label, unpack,
                                         on_cached=lambda: report("cached", 0, None))
        report("done", record.unpacked_bytes, record.unpacked_bytes)
        return record


def _blob_opener(client: RegistryClient, repository: str, digest: str):  # type: ignore[no-untyped-def]
    import contextlib

    @contextlib.contextmanager
    def opener():  # type: ignore[no-untyped-def]
        with client.blob(repository, digest) as chunks:
            yield IterReader(chunks)
    return opener


def _synth_config(diff_ids: list[str]) -> bytes:
    """The OCI config of a one-layer rootfs import (its digest is the image id)."""
    doc = {"architecture": "amd64", "os": "linux", "config": {},
           "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
