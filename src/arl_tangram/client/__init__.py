"""The SDK: ``connect()`` (embedded) or ``connect(url, token=...)`` (a server) -> ``AsyncClient`` (``create_env``, ``env.exec``, files, sessions,
``call``), and the synchronous ``Client``; results are ``ActionResult`` s."""

from arl_tangram.client.builtin import builtin_model
from arl_tangram.client.client import AsyncClient, Elastic, Env, Session
from arl_tangram.client.connect import Client, Connection, SyncEnv, connect
from arl_tangram.client.http_transport import HttpError, HttpTransport
from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import ActionResult

__all__ = [
    "ActionResult", "AsyncClient", "Client", "Connection", "Elastic", "Env", "HttpError", "HttpTransport", "Session",
    "SpecError", "SyncEnv", "builtin_model", "connect",
]
