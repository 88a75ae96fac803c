"""Fixtures of the image-store tests: a store in the test's temp dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from arl_tangram.managers.images import ImageStore, ImageStoreConfig


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    stores: list[ImageStore] = []

    def make(**kw) -> ImageStore:  # type: ignore[no-untyped-def]
        kw.setdefault("store_path", tmp_path / "store")
        store = ImageStore(ImageStoreConfig(**kw))
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()
