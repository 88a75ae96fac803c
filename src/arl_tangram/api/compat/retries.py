"""Shell: which SandboxFusion calls are retries of a call we answered 504.

Why: verl retries a 504 (its client gives each test case three attempts, one or two seconds
apart). A retry used to join the back of its pool bucket's line, behind borrowers that
arrived after the first attempt, so under verl's load (issue 26: 768 requests for 64
sandboxes, half of them looping for 3 s) an unlucky case could be turned away three times
and scored as a sandbox error. A retry now waits in the bucket's retry line, served first
(``CodeEnvPool.acquire(retry=True)``), so a case turned away once is served next.

Contract: ``key(tenant, body)`` fingerprints a call by everything that makes two requests
the same call to verl (tenant, language, code, stdin, timeouts, memory). ``note(key)``
remembers a call answered 504 for ``TTL_S``; ``take(key)`` says whether the call is such a
retry and forgets it (one priority pass per 504). At most ``MAX_KEYS`` are kept, the oldest
dropped first. Identical calls from different clients share a key: one of them gets the
retry's place, which reorders only that tenant's own line. Runs on the event loop only.
"""

from __future__ import annotations

import collections
import hashlib
import time
from typing import Any

TTL_S = 120.0  # assumption: longer than verl's three attempts (3 x its read timeout + 3 s of delays)
MAX_KEYS = 100_000


def key(tenant: str, body: Any) -> bytes:
    """A call's fingerprint (``body``: a ``RunCodeRequest``)."""
    return fingerprint(tenant, body.language, body.code, body.stdin or "", repr((body.compile_timeout, body.run_timeout, body.memory_limit_MB)))


def fingerprint(*parts: str) -> bytes:
    """16 bytes that tell ``parts`` apart (each length-prefixed, so no two splits of the
    same text collide); also the program key of ``compat.long_programs``."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


class RetryMemory:
    """Calls answered 504 lately (see the module docstring)."""

    def __init__(self) -> None:
        self._seen: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def note(self, call: bytes) -> None:
        self._seen[call] = time.monotonic()
        self._seen.move_to_end(call)
        while len(self._seen) > MAX_KEYS:
            self._seen.popitem(last=False)

    def take(self, call: bytes) -> bool:
        at = self._seen.pop(call, None)
        return at is not None and time.monotonic() - at <= TTL_S

    def __len__(self) -> int:
        return len(self._seen)
