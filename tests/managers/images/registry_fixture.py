"""A real docker-registry (distribution 2.x) on 127.0.0.1 for tests: the bench's
``LoopbackRegistry`` (temp storage and config, an access log to count blob fetches, optional
htpasswd basic auth; stopped by PID after) with the tests' argument order for ``push``.
Images are pushed with skopeo from OCI layouts the tests build."""

from __future__ import annotations

from pathlib import Path

from arl_tangram.bench.image_kit import LoopbackRegistry, free_port

__all__ = ["Registry", "free_port"]


class Registry(LoopbackRegistry):
    """One docker-registry process; ``host`` is its HOST:PORT."""

    def push(self, layout: Path, name: str, tag: str = "latest") -> str:  # type: ignore[override]
        return super().push(layout, tag, name)
