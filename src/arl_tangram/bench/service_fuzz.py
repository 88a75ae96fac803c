"""Bench: schemathesis over a running server's ``/openapi.json`` (every route in it, the
compat faces too once they are in the schema), with its checks, example count and seed pinned.

Who calls: the suite's fuzz test (a few examples per route) and ``arl-tangram bench service
--fuzz-examples N`` (a longer run). ``schemathesis run`` is a subprocess (its CLI runs the
coverage phase too: boundary values, missing fields, methods a path does not take); what it
prints comes back with its exit status. ``POST /v1/services`` is fuzzed too: a tenant may
register only what the operator's allowlist names (403 otherwise, before anything is imported
or read), and the fuzzed server allows nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHECKS = (
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_headers_conformance",
    "response_schema_conformance", "negative_data_rejection", "missing_required_header", "unsupported_method",
    "allow_header_conformance", "documented_positive_acceptance",
)  # fmt: skip
EXCLUDED: tuple[str, ...] = ()
SEED = 20261201


@dataclass(frozen=True)
class FuzzResult:
    """``rc`` 0: no failure; ``output``: schemathesis' report (its last part names each failure)."""

    rc: int
    output: str

    @property
    def summary(self) -> str:
        return self.output[-6000:]


def run_fuzz(url: str, *, max_examples: int, seed: int = SEED, timeout_s: float = 600.0, workers: int = 1) -> FuzzResult:
    """Fuzz the server at ``url``; bounded by ``timeout_s`` (then rc 124)."""
    cli = Path(sys.executable).with_name("schemathesis")
    argv = [
        str(cli), "run", f"{url}/openapi.json", "--checks", ",".join(CHECKS), "--max-examples", str(max_examples),
        "--seed", str(seed), "--phases", "examples,coverage,fuzzing", "--workers", str(workers),
        "--request-timeout", "30", "--no-shrink",
    ]  # fmt: skip
    for name in EXCLUDED:
        argv += ["--exclude-name", name]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "arl_tangram.bench.fuzz_hooks", "NO_COLOR": "1"}
    # its own working directory: schemathesis keeps a cache (.schemathesis/) where it runs
    with tempfile.TemporaryDirectory(prefix=f"arl-tangram-{os.getpid()}-fuzz-") as cwd:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return FuzzResult(124, out)
    return FuzzResult(done.returncode, done.stdout + done.stderr)
