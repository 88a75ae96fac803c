"""ARL-Tangram: action-level orchestration of agentic RL's external resources.

``arl_tangram.connect()`` is the SDK's entry point (imported lazily, so ``import
arl_tangram.core`` stays free of the managers and their dependencies).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arl_tangram.client.connect import Connection

__version__ = "0.1.0"


def connect(url: str | None = None, **kwargs: Any) -> Connection:
    """See ``arl_tangram.client.connect``."""
    from arl_tangram.client.connect import connect as _connect

    return _connect(url, **kwargs)
