"""Shell: the E2B-compatible face: E2B's control plane and the in-sandbox ``envd`` service,
so the unchanged ``e2b`` SDK (and slime, miles, CubeSandbox users) run on ARL-Tangram by
setting ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` to ``<server><prefix>`` (``[e2b] prefix``,
default ``/e2b``).

Files: ``control`` (sandboxes: create, list, get, kill, timeout, pause/resume/connect),
``sandboxes`` (the face's state: sandbox -> env, TTL, processes), ``envd`` (routing by
``E2b-Sandbox-Id`` / host, ``X-Access-Token``), ``connect`` (the Connect protocol's
framing and codecs), ``process`` and ``filesystem`` (envd's RPC services), ``files``
(envd's REST ``/health`` and ``/files``), ``fork`` (fork and snapshots). Wire facts: ../shared/PROTOCOLS.md (E2B).
Needs the ``e2b`` package (its protobuf message classes); ``mount_compat`` skips the face
when it is not installed.
"""

from __future__ import annotations

from fastapi import FastAPI

from arl_tangram.api.compat.e2b import control, files, filesystem, fork, process
from arl_tangram.api.compat.e2b.sandboxes import E2bState
from arl_tangram.api.state import ApiState
from arl_tangram.runtime.config_e2b import E2bConfig


def include_e2b(app: FastAPI, prefix: str) -> None:
    """Add the face's routes under ``prefix`` (before the server starts)."""
    for router in (control.router, fork.router, process.router, filesystem.router, files.router):
        app.include_router(router, prefix=prefix)


def start_e2b(app: FastAPI, api: ApiState, config: E2bConfig) -> E2bState:
    """The face's state on ``app`` (in the lifespan, once the runtime runs)."""
    state = E2bState(api, config)
    state.start()
    app.state.e2b = state
    api.e2b_prefix = config.prefix
    return state


__all__ = ["E2bState", "include_e2b", "start_e2b"]
