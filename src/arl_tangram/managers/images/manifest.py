"""Shell: OCI / Docker v2 manifests, indexes and image configs, parsed and checked (pure).

Shared by the registry client and the OCI-layout source. An index resolves to its
linux/amd64 entry; one without it is an ``ImageError`` listing the platforms it has.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from arl_tangram.managers.images.errors import ImageError
from arl_tangram.managers.images.reference import DIGEST_RE

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MAX_JSON_BYTES = 4 << 20
PLATFORM = ("linux", "amd64")


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what to fetch, how big it claims to be, which platform (indexes)."""

    media_type: str
    digest: str
    size: int
    platform: tuple[str, str] | None = None
    ref_name: str | None = None


@dataclass(frozen=True)
class ImageManifest:
    """An image manifest: its config blob and its layer blobs, lowest first."""

    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True)
class RawConfig:
    """What the store uses of an image config blob."""

    diff_ids: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    working_dir: str
    user: str


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify(data: bytes, digest: str, what: str) -> None:
    """Raise unless ``data`` hashes to ``digest`` (``what`` names it in the error)."""
    if sha256_digest(data) != digest:
        raise ImageError("image", f"{what}: digest mismatch: content is {sha256_digest(data)}, expected {digest}")


def _json(data: bytes, what: str) -> dict:
    if len(data) > MAX_JSON_BYTES:
        raise ImageError("image", f"{what}: larger than {MAX_JSON_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageError("image", f"{what}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ImageError("image", f"{what}: must be a JSON object")
    return doc


def _descriptor(doc: object, what: str) -> Descriptor:
    if not isinstance(doc, dict):
        raise ImageError("image", f"{what}: a descriptor must be an object")
    digest, size = doc.get("digest"), doc.get("size")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise ImageError("image", f"{what}: descriptor digest must be sha256:<64 hex>", digest)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ImageError("image", f"{what}: descriptor size must be a non-negative integer", size)
    plat = doc.get("platform")
    platform = (str(plat.get("os", "")), str(plat.get("architecture", ""))) if isinstance(plat, dict) else None
    ann = doc.get("annotations")
    ref_name = ann.get("org.opencontainers.image.ref.name") if isinstance(ann, dict) else None
    return Descriptor(str(doc.get("mediaType", "")), digest, size, platform, ref_name)


def media_type_of(data: bytes, header_type: str | None, what: str) -> str:
    """The manifest's media type: its own ``mediaType``, else the HTTP header, else by shape."""
    doc = _json(data, what)
    kind = doc.get("mediaType") or header_type or ""
    if kind in MANIFEST_TYPES or kind in INDEX_TYPES:
        return str(kind)
    return OCI_INDEX if "manifests" in doc else OCI_MANIFEST


def parse_index(data: bytes, what: str) -> tuple[Descriptor, ...]:
    items = _json(data, what).get("manifests")
    if not isinstance(items, list):
        raise ImageError("image", f"{what}: an index must list manifests")
    return tuple(_descriptor(m, what) for m in items)


def select_platform(entries: tuple[Descriptor, ...], what: str) -> Descriptor:
    """The linux/amd64 entry of an index (the first one, in index order)."""
    for entry in entries:
        if entry.platform == PLATFORM:
            return entry
    have = sorted({"/".join(e.platform) for e in entries if e.platform}) or ["no platforms"]
    raise ImageError("image", f"{what}: index has no linux/amd64 manifest (has: {', '.join(have)})")


def parse_manifest(data: bytes, what: str) -> ImageManifest:
    doc = _json(data, what)
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise ImageError("image", f"{what}: a manifest must list layers")
    return ImageManifest(_descriptor(doc.get("config"), what), tuple(_descriptor(x, what) for x in layers))


def parse_config(data: bytes, what: str) -> RawConfig:
    doc = _json(data, what)
    rootfs = doc.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) and DIGEST_RE.match(d) for d in diff_ids):
        raise ImageError("image", f"{what}: config rootfs.diff_ids must list sha256 digests")
    cfg = doc.get("config")
    cfg = cfg if isinstance(cfg, dict) else {}
    env = []
    for item in cfg.get("Env") or []:
        if not isinstance(item, str):
            raise ImageError("image", f"{what}: config Env entries must be strings", item)
        key, _, value = item.partition("=")
        env.append((key, value))
    working_dir = cfg.get("WorkingDir") or "/"
    user = cfg.get("User") or ""
    if not isinstance(working_dir, str) or not working_dir.startswith("/"):
        raise ImageError("image", f"{what}: config WorkingDir must be an absolute path", working_dir)
    if not isinstance(user, str):
        raise ImageError("image", f"{what}: config User must be a string", user)
    return RawConfig(tuple(diff_ids), tuple(env), working_dir, user)
