"""Shell: which credential each face of the server reads, for the edge's check before a body.

The faces keep their own authentication (and their own 401 shapes); this only lets the edge
refuse a body that could never be accepted before reading it. The rules mirror the faces':
no tokens configured: every caller passes; else SWE-ReX calls carry ``X-API-Key``,
SandboxFusion calls the token in the path (``/t/<token>/...``; without it they cannot pass),
the E2B face (``X-API-Key``, or a sandbox's ``X-Access-Token``) is left to the face, which
checks them before it reads a body and answers in E2B's own 401 shape; every
other route ``Authorization: Bearer <token>``. Tokens compare in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

_UNAUTHENTICATED_FACE = ("/run_code", "/run_jupyter")


def presented_token(path: str, headers: Mapping[str, str]) -> str:
    """The token a request presents to the face its path belongs to ('' when none)."""
    if path.startswith("/swerex/"):
        return headers.get("x-api-key", "").strip()
    if path.startswith("/t/"):
        return path.split("/")[2] if path.count("/") >= 3 else ""
    if path in _UNAUTHENTICATED_FACE:
        return ""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def has_credential(api: Any, path: str, headers: Mapping[str, str]) -> bool:
    """Whether the request names a known tenant (always, when no tokens are configured)."""
    tokens: Mapping[str, str] = api.tokens
    if not tokens:
        return True
    e2b_prefix = getattr(api, "e2b_prefix", None)
    if e2b_prefix and (path == e2b_prefix or path.startswith(e2b_prefix + "/")):
        return True  # the face checks its key / the sandbox's token before any body, in E2B's 401 shape
    given = presented_token(path, headers).encode()
    found = False
    for token in tokens:  # every token compared: the time says nothing
        found = hmac.compare_digest(token.encode(), given) or found
    return found
