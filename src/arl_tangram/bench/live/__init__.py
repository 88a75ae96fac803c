"""Shell: ``arl-tangram bench live``, real agentic-RL rollouts against the baselines.

(Work in progress: the workloads and the report land in the following commits.)
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    raise SystemExit("bench live: not implemented yet")
