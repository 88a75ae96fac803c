"""Shell: the errors the image store raises; each names the field and the rule it broke.

``field`` is the input or the part that failed ("image", "registry", "layer", "user",
"store"); ``rule`` says what was expected, naming the layer digest or the registry's HTTP
status where there is one. Messages never contain credentials.
"""

from __future__ import annotations


class ImageError(Exception):
    """Base class of every error raised by ``managers.images``."""

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        self.message = f"{field}: {rule}" + ("" if value is None else f" (got {value!r})")
        super().__init__(self.message)


class ImageRefError(ImageError, ValueError):
    """A reference is malformed, names the host root, or needs a default registry that is unset."""


class ImageNotFoundError(ImageError, KeyError):
    """No such image: not in the store (lookup, remove) or not at the registry (404)."""

    def __str__(self) -> str:
        return self.message


class RegistryError(ImageError):
    """The registry was unreachable or answered with an error status (named in ``rule``)."""

    def __init__(self, field: str, rule: str, value: object = None, status: int | None = None) -> None:
        self.status = status
        super().__init__(field, rule, value)


class LayerRefusedError(ImageError):
    """A layer broke a safety rule (hostile path, digest mismatch, truncated, over a cap)."""
