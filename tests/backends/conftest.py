"""Shared by the Ray backend tests: a local Ray cluster that is gone after the test."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from tests.managers.cpu.conftest import IN_CI, host_can_sandbox


@contextlib.contextmanager
def local_cluster(resources: Mapping[str, float], **start: Any) -> Iterator[Any]:
    """A ``LocalRayCluster`` whose first node offers ``resources`` (``start``: more of its
    ``start`` arguments); skips where sandboxes cannot run outside CI. On exit the cluster
    is shut down and its temp dir (Ray's, inside it) must be gone."""
    if not host_can_sandbox() and not IN_CI:
        pytest.skip("needs root and bubblewrap")
    from arl_tangram.backends.ray.local_cluster import LocalRayCluster

    c = LocalRayCluster().start(resources, **start)
    try:
        yield c
    finally:
        c.close()
    assert not os.path.exists(c.temp_dir)
