"""Shell: which layers garbage collection removes (pure selection; the store does the I/O).

Only layers no image references, no holder pins and no pull holds are candidates; they go
least-recently-used first (ties by digest, for determinism) until the bytes fall to the
target.
"""

from __future__ import annotations

from collections.abc import Mapping, Set


def select_victims(
    layer_bytes: Mapping[str, int],
    last_used: Mapping[str, float],
    protected: Set[str],
    used_bytes: int,
    target_bytes: int,
) -> list[str]:
    """Digests to remove, in removal order, so that ``used_bytes`` drops to ``target_bytes``
    (or as close as the unprotected layers allow)."""
    victims: list[str] = []
    candidates = sorted((last_used.get(d, 0.0), d) for d in layer_bytes if d not in protected)
    for _, digest in candidates:
        if used_bytes <= target_bytes:
            break
        victims.append(digest)
        used_bytes -= layer_bytes[digest]
    return victims
