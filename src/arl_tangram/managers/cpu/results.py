"""Shell: what an action inside a sandbox ends with, and the rule that names its outcome."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Outcome(enum.StrEnum):
    """Terminal states of an action (the same strings as ``core.events.TERMINAL_OUTCOMES``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    OOM_KILLED = "oom_killed"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class ExecResult:
    """Result of one action. ``exit_code`` is the program's status, ``-N`` when signal N
    killed it, ``None`` when it never ran. Output streams are capped; ``*_truncated`` marks
    a cut and ``*_bytes`` counts what the program really wrote. ``cpus`` are the cpus the run
was confined to (``cores`` of them), ``millicores`` its CFS quota; ``leftovers_killed``
counts the processes it left running that were killed when it ended."""

    outcome: Outcome
    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_mem_bytes: int = 0
    cores: int = 0
    cpus: tuple[int, ...] = ()
    millicores: int = 0
    error: str | None = None
    leftovers_killed: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    paused_s: float = 0.0  # spent paused at its memory limit (queue time, not execution)
    footprint_bytes: int | None = None  # its env's idle footprint measured after it (memory per action)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.SUCCEEDED

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


def classify(
    *, exit_code: int | None, timed_out: bool, cancelled: bool, oom_kills: int, error: str | None
) -> Outcome:
    """Name the outcome. Order matters: an infrastructure error wins, then the manager's own
    kills (cancel, timeout), then an OOM kill in the sandbox during the action (only when
    the program did not succeed: a child killed by OOM while the parent recovered is a
    success), then the program's status."""
    if error is not None:
        return Outcome.ERROR
    if cancelled:
        return Outcome.CANCELLED
    if timed_out:
        return Outcome.TIMED_OUT
    if oom_kills > 0 and exit_code != 0:
        return Outcome.OOM_KILLED
    return Outcome.SUCCEEDED if exit_code == 0 else Outcome.FAILED
