"""Fixtures of the snapshot tests: the session's SWE-style test image at a loopback registry
(``tests.images.kit``), the SDK over both transports, and below the controller a real CPU
manager with a tiny image layer (``tests.managers.cpu.conftest``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.managers.cpu.manager import CpuManager
from tests.client.conftest import connector, transport
from tests.images.kit import image_kit
from tests.managers.cpu.conftest import image_dir, manager
from tests.snapshots.node_kit import Node, open_node

__all__ = ["connector", "image_dir", "image_kit", "manager", "transport"]


@pytest.fixture
def node(manager: CpuManager, image_dir: Path, tmp_path: Path) -> Iterator[Node]:
    n = open_node(manager, image_dir, tmp_path / "snapshots", max_depth=2)
    yield n
    n.close()
