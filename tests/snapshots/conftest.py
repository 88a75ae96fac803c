"""Fixtures of the snapshot tests: the session's SWE-style test image at a loopback
registry (``tests.images.kit``) and the SDK over both transports."""

from tests.client.conftest import connector, transport
from tests.images.kit import image_kit

__all__ = ["connector", "image_kit", "transport"]
