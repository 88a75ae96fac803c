"""Core: what an env is (``EnvSpec``): its root (the host's or an OCI image), its limits, and
once resolved, the layers its image is made of.

One formulation shared by the SDK, the HTTP API, the scheduler and the node agent: clients
and the API build an ``EnvSpec``; the scheduler places it (image locality reads ``layers``);
the node agent turns it into its CPU manager's sandbox spec, with an overlay root when an
image is named. Every constructor validates and raises ``SpecError`` naming the field and
the rule; a spec that exists is well-formed.
"""

from __future__ import annotations

from dataclasses import dataclass

from arl_tangram.core.errors import SpecError

#: Image uid 0 is host uid ``UID_SHIFT``: every image layer is chown-shifted into one shared
#: unprivileged host range of ``UID_RANGE`` ids at unpack time (ids >= ``UID_RANGE`` in a layer
#: are refused). Sharing one range is safe: lower layers are read-only overlay lowers, each
#: sandbox's writable upper lives in its own mount namespace, and pid/ipc/net namespaces are
#: per sandbox, so no sandbox can reach another's processes or writable files.
UID_SHIFT = 100000
UID_RANGE = 65536

#: names of the host's read-only root; they never reach an image store
HOST_IMAGES = ("host", "python")
MAX_REFERENCE_CHARS = 512
_HEX = frozenset("0123456789abcdef")
_LOWER = "abcdefghijklmnopqrstuvwxyz0123456789"
_NAME_CHARS = frozenset(_LOWER + "._-")
_HOST_CHARS = frozenset(_LOWER + _LOWER.upper() + ".-")
_TAG_CHARS = frozenset(_LOWER + _LOWER.upper() + "_.-")


SNAPSHOT_ID_PREFIX = "snap-"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def check_snapshot_id(value: object, field_name: str = "snapshot_id") -> str:
    """``value`` if it is ``snap-`` and 6-40 lowercase alphanumerics, else ``SpecError``."""
    if (
        not isinstance(value, str) or not value.startswith(SNAPSHOT_ID_PREFIX)
        or not 6 <= len(value) - len(SNAPSHOT_ID_PREFIX) <= 40 or not set(value[len(SNAPSHOT_ID_PREFIX):]) <= _ID_CHARS
    ):  # fmt: skip
        raise SpecError(field_name, "must be 'snap-' and 6-40 lowercase letters or digits", value)
    return value


def is_digest(text: str) -> bool:
    """Whether ``text`` is ``sha256:`` and 64 lowercase hex digits."""
    return text.startswith("sha256:") and len(text) == 71 and set(text[7:]) <= _HEX


def _is_component(part: str) -> bool:
    # lowercase alphanumerics, separated (never led or ended) by '.', '_' or '-'
    return bool(part) and set(part) <= _NAME_CHARS and part[0] in _LOWER and part[-1] in _LOWER


def _is_host(part: str) -> bool:
    host, _, port = part.partition(":")
    labels = host.split(".")
    if not all(label and set(label) <= _HOST_CHARS and label[0] != "-" and label[-1] != "-" for label in labels):
        return False
    return not port or (port.isdigit() and len(port) <= 5)


def _is_reference(image: str) -> bool:
    """[HOST[:PORT]/]name[/name...][:tag][@sha256:<hex>], the distribution spec's grammar."""
    name, at, digest = image.partition("@")
    if at and not is_digest(digest):
        return False
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        if not _is_host(parts[0]):
            return False
        parts = parts[1:]
    last, colon, tag = parts[-1].partition(":")
    if colon and not (0 < len(tag) <= 128 and set(tag) <= _TAG_CHARS and tag[0] not in ".-"):
        return False
    return all(_is_component(p) for p in [*parts[:-1], last])


def is_host_image(image: str) -> bool:
    """Whether ``image`` names the host's read-only root rather than an OCI image."""
    return image in HOST_IMAGES


def check_image_reference(image: object, field_name: str = "image") -> str:
    """``image`` if it is the host root, an image id ``sha256:<64 hex>`` or a well-formed
    registry reference; else ``SpecError`` naming ``field_name``. Purely syntactic: whether
    the image exists is the image store's answer."""
    if not isinstance(image, str) or not image:
        raise SpecError(field_name, "must be a non-empty string", image)
    if is_host_image(image) or is_digest(image):
        return image
    if image.startswith("sha256:") or len(image) > MAX_REFERENCE_CHARS or not _is_reference(image):
        raise SpecError(
            field_name, "must be 'host', 'python', 'sha256:<64 hex>' or a reference [HOST[:PORT]/]name[:tag][@sha256:<hex>]", image
        )  # fmt: skip
    return image


@dataclass(frozen=True)
class LayerNeed:
    """One layer an env's image needs: its digest (the uncompressed tar's, ``sha256:...``)
    and its unpacked size, what a node without it must fetch and unpack."""

    digest: str
    size_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.digest, str) or not is_digest(self.digest):
            raise SpecError("layers.digest", "must be 'sha256:' and 64 lowercase hex digits", self.digest)
        if not isinstance(self.size_bytes, int) or isinstance(self.size_bytes, bool) or self.size_bytes < 0:
            raise SpecError("layers.size_bytes", "must be an integer >= 0", self.size_bytes)


def _int_at_least(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpecError(name, f"must be an integer >= {minimum}", value)


@dataclass(frozen=True)
class EnvSpec:
    """A stateful sandbox that lives for a trajectory. It holds no CPU while idle, and under
    memory per action (``core.memory``) only its measured idle footprint of memory.

    ``image``: ``host`` (or ``python``: the host's read-only root) or an OCI image reference
    or id. ``mem_bytes`` is its memory limit, the ceiling of its footprint plus its running
    actions' grants (a pod-style policy reserves it for the env's life); it bounds every
    process and the tmpfs pages they write; ``pids_max``
    bounds tasks; ``workspace_bytes`` and ``tmp_bytes`` size its private workspace and /tmp;
    ``writable_bytes`` caps an image env's writable layer (unused on the host root).
    ``layers``: the image's layers, lowest first, once someone resolved them (the
    controller, from a node's store); empty when unknown or on the host root. The scheduler
    prefers nodes holding them and charges a pull for the bytes a node lacks.
    ``snapshot``: the snapshot (``snap-...``) whose filesystem the env starts from, on its
    image (an image env only: the host root has no writable layer to freeze). ``fork_of``:
    the env whose node it must run on (a fork's child: the snapshot's layers are there).
    """

    env_id: str
    mem_bytes: int
    tenant: str = "default"
    trajectory_id: str = ""
    image: str = "host"
    pids_max: int = 512
    workspace_bytes: int = 512 << 20
    tmp_bytes: int = 256 << 20
    writable_bytes: int = 1 << 30
    layers: tuple[LayerNeed, ...] = ()
    snapshot: str = ""
    fork_of: str = ""

    def __post_init__(self) -> None:
        if not self.env_id or not isinstance(self.env_id, str):
            raise SpecError("env_id", "must be a non-empty string", self.env_id)
        _int_at_least("mem_bytes", self.mem_bytes, 0)
        check_image_reference(self.image)
        _int_at_least("pids_max", self.pids_max, 8)
        for name in ("workspace_bytes", "tmp_bytes", "writable_bytes"):
            _int_at_least(name, getattr(self, name), 1 << 20)
        if not isinstance(self.layers, tuple) or not all(isinstance(layer, LayerNeed) for layer in self.layers):
            raise SpecError("layers", "must be a tuple of LayerNeed", self.layers)
        if self.layers and is_host_image(self.image):
            raise SpecError("layers", "must be empty on the host root", self.image)
        if self.snapshot:
            check_snapshot_id(self.snapshot, "snapshot")
            if is_host_image(self.image):
                raise SpecError("snapshot", "needs an image env (the host root has no writable layer to start from)", self.image)
        if not isinstance(self.fork_of, str) or (self.fork_of and not self.snapshot):
            raise SpecError("fork_of", "must be a string, and set only with snapshot", self.fork_of)

    @property
    def on_image(self) -> bool:
        """Whether the env's root is an OCI image (not the host's)."""
        return not is_host_image(self.image)
