"""Shell: image reference parsing and normalisation (pure; no I/O).

Forms: ``sha256:<64 hex>`` (an image id), ``HOST[:PORT]/name[:tag|@digest]``, and bare
``name[:tag|@digest]`` that resolves against the default registry (an error without one when
pulling; a local lookup keeps it bare). ``host`` and ``python`` name the host root and are
refused here: callers handle them before the store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from arl_tangram.managers.images.errors import ImageRefError

HOST_ALIASES = frozenset({"host", "python"})
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9-]+)*(?::[0-9]{1,5})?$")


@dataclass(frozen=True)
class ImageReference:
    """A parsed reference. ``registry`` is None for a bare name; ``digest`` for ``@sha256:``."""

    registry: str | None
    repository: str
    tag: str | None
    digest: str | None

    @property
    def manifest_ref(self) -> str:
        """What to ask the registry's manifest endpoint for (the digest wins over the tag)."""
        return self.digest or self.tag or "latest"

    def canonical(self) -> str:
        """The normalised string the store indexes (``latest`` filled in when untagged)."""
        head = f"{self.registry}/{self.repository}" if self.registry else self.repository
        if self.digest:
            return f"{head}@{self.digest}"
        return f"{head}:{self.tag or 'latest'}"


def is_image_id(text: str) -> bool:
    """True for ``sha256:<64 lowercase hex>``."""
    return bool(DIGEST_RE.match(text))


def parse_reference(text: object, default_registry: str | None = None, *, need_registry: bool = False) -> ImageReference:
    """Parse ``text``; bare names take ``default_registry``. With ``need_registry`` (a pull),
    a bare name and no default registry raise ``ImageRefError`` saying none is configured."""
    if not isinstance(text, str) or not text or len(text) > 1024 or text != text.strip():
        raise ImageRefError("image", "must be a non-empty reference without surrounding spaces", text)
    if text in HOST_ALIASES:
        raise ImageRefError("image", f"{text!r} names the host root, not a stored image", text)
    if is_image_id(text):
        raise ImageRefError("image", "an image id (sha256:...) has no registry to pull from", text)
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not DIGEST_RE.match(digest):
            raise ImageRefError("image", "a digest must be sha256:<64 lowercase hex>", text)
    registry: str | None = None
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        if not _HOST_RE.match(first):
            raise ImageRefError("image", "registry must be HOST[:PORT]", text)
        registry, rest = first, remainder
    tag = None
    name, colon, maybe_tag = rest.rpartition(":")
    if colon:
        if not _TAG_RE.match(maybe_tag):
            raise ImageRefError("image", "tag must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", text)
        rest, tag = name, maybe_tag
    if not _NAME_RE.match(rest):
        raise ImageRefError("image", "name must be lowercase path components [a-z0-9._-] separated by /", text)
    if registry is None:
        registry = default_registry
    if registry is None and need_registry:
        raise ImageRefError("image", "a bare name needs images.default_registry, and none is configured", text)
    return ImageReference(registry=registry, repository=rest, tag=tag, digest=digest)
