"""E2B's fork and snapshots through the unchanged ``e2b`` SDK, over the runtime's own
snapshot/fork: on an image template, children see the parent's files as they were and
diverge on their own, and a snapshot is a template a new sandbox starts from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.runtime.config_e2b import E2bConfig
from tests.compat.conftest import serve_compat
from tests.images.kit import ImageKit

pytest.importorskip("e2b", reason="the e2b client package is not installed")
from e2b import Sandbox  # noqa: E402

pytestmark = pytest.mark.usefixtures("sandbox_host")


@pytest.fixture
def api(image_kit: ImageKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    config = image_kit.config(tmp_path / "store")
    config = type(config)(images=config.images, e2b=E2bConfig(mem_bytes=256 << 20, templates={"base": image_kit.reference}))
    with serve_compat(config) as server:
        url = f"{server.url}/e2b"
        for name, value in (("E2B_API_URL", url), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", "e2b_" + "0" * 40)):
            monkeypatch.setenv(name, value)
        yield url


def test_fork_children_start_from_the_parent_and_diverge(api: str) -> None:
    parent = Sandbox.create("base", timeout=60)
    try:
        parent.files.write("state.txt", "set up")
        children = parent.fork(count=2, timeout=60)
        assert all(isinstance(c, Sandbox) for c in children)
        try:
            for i, child in enumerate(children):
                assert child.files.read("state.txt") == "set up"
                child.files.write("state.txt", f"child {i}")
            assert [c.files.read("state.txt") for c in children] == ["child 0", "child 1"]
            assert parent.files.read("state.txt") == "set up"
        finally:
            for child in children:
                child.kill()
    finally:
        parent.kill()


def test_a_snapshot_is_a_template(api: str) -> None:
    parent = Sandbox.create("base", timeout=60)
    try:
        parent.files.write("state.txt", "snapshotted")
        snap = parent.create_snapshot(name="setup")
        parent.files.write("state.txt", "changed later")
        restored = Sandbox.create(snap.snapshot_id, timeout=60)
        try:
            assert restored.files.read("state.txt") == "snapshotted"
        finally:
            restored.kill()
    finally:
        parent.kill()
