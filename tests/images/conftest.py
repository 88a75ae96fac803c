"""Fixtures of the integrated image tests: the session's test image at a loopback registry,
and the SDK over both transports (see ``tests/client/conftest``)."""

from tests.client.conftest import connector, transport
from tests.images.kit import image_kit

__all__ = ["connector", "image_kit", "transport"]
