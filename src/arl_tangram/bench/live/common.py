"""Shell: the types shared by the live benchmark's workloads, and its progress printer.

Every workload module of ``arl-tangram bench live`` exposes
``run(opts: LiveOptions, progress: Progress) -> WorkloadResult`` (synchronous; it may run its
own event loop with ``asyncio.run``). ``__init__.main`` calls them in turn, and ``report``
turns their ``WorkloadResult`` into tables, plots and the ``--json`` object.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from arl_tangram.core.policies.elastic import DEFAULT_SHORT_FIRST_SLOWDOWN


@dataclass(frozen=True)
class LiveOptions:
    """What the command line asked for. ``quick`` shrinks every workload (swe: T halved, issue 24);
    ``report_dir`` (or None) receives the PNG plots; ``seed`` seeds every random choice."""

    quick: bool
    report_dir: Path | None
    seed: int = 0
    judge: str = "minilm"  # DeepSearch's judge: "minilm" or "generative" (``judges.py``)
    preempt_quantum_s: float | None = None  # coding's tangram runs with preemption (issue 26); None: off
    short_first_slowdown: float = DEFAULT_SHORT_FIRST_SLOWDOWN  # swe's and coding's tangram queue order (0: FCFS)
    cpu_packing: bool = True  # coding's tangram packs short runs by their measured CPU use (``core.packing``)


def elastic_params(
    preempt_quantum_s: float | None = None, short_first_slowdown: float | None = None, cpu_packing: bool | None = None
) -> dict[str, float | bool]:
    """A tangram run's elastic-policy parameters: those given (None: the policy's default)."""
    params = {"preempt_quantum_s": preempt_quantum_s, "short_first_slowdown": short_first_slowdown, "cpu_packing": cpu_packing}
    return {k: v for k, v in params.items() if v is not None}


class Progress:
    """Prints ``[workload] done/total label`` lines to stderr while a workload runs.

    Thread-safe (one lock); callable from any thread or event loop. ``start`` resets a
    workload's counter; ``advance`` prints at most a few lines per second per workload (and
    always the last one), so a 32-trajectory run does not flood the terminal.
    """

    def __init__(self, stream: TextIO | None = None, min_interval_s: float = 0.5) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._total: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._started_at: dict[str, float] = {}
        self._printed_at: dict[str, float] = {}

    def start(self, workload: str, total: int) -> None:
        with self._lock:
            self._total[workload] = total
            self._done[workload] = 0
            self._started_at[workload] = time.monotonic()
            self._printed_at[workload] = 0.0
            self._print(workload, "started")

    def advance(self, workload: str, n: int = 1) -> None:
        with self._lock:
            self._done[workload] = self._done.get(workload, 0) + n
            now = time.monotonic()
            last = self._done[workload] >= self._total.get(workload, 0)
            if last or now - self._printed_at.get(workload, 0.0) >= self._min_interval_s:
                self._printed_at[workload] = now
                self._print(workload, "done" if last else "")

    def note(self, workload: str, text: str) -> None:
        with self._lock:
            self._print(workload, text)

    def _print(self, workload: str, label: str) -> None:
        total = self._total.get(workload, 0)
        done = self._done.get(workload, 0)
        width = 20
        filled = width * done // total if total else 0
        bar = "#" * filled + "." * (width - filled)
        elapsed_s = time.monotonic() - self._started_at.get(workload, time.monotonic())
        line = f"[{workload}] [{bar}] {done}/{total} {elapsed_s:5.1f}s {label}".rstrip()
        print(line, file=self._stream, flush=True)


@dataclass
class SystemRun:
    """One system's run of one workload.

    ``act_s`` holds one action completion time per action (the paper's ACT: queue + exec +
    overhead of one action, as the SDK's ``ActionResult`` splits it); ``queue_s``/``exec_s``/
    ``overhead_s`` are parallel lists, the same actions in the same order.
    ``step_s`` is the batch's wall time, first trajectory start to last trajectory end.
    ``core_s_reserved``/``core_s_used`` are CPU core-seconds held for the system vs consumed.
    ``device_bytes`` is peak device memory of the model services; ``leaked_429`` counts
    provider 429s that reached a trajectory. ``extra`` holds workload-specific numbers.
    Optional, for the CPU-over-time plot (seconds from the run's start): ``reserved_spans``
    ``(start_s, end_s, cores)`` held, ``used_spans`` ``(start_s, end_s, core_s)`` consumed;
    for the memory-over-time plot, ``mem_reserved_spans``/``mem_used_spans`` in GiB.
    """

    system: str
    act_s: list[float]
    queue_s: list[float]
    exec_s: list[float]
    overhead_s: list[float]
    step_s: float
    core_s_reserved: float = 0.0
    core_s_used: float = 0.0
    device_bytes: int = 0
    leaked_429: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    reserved_spans: list[tuple[float, float, float]] = field(default_factory=list)
    used_spans: list[tuple[float, float, float]] = field(default_factory=list)
    mem_reserved_spans: list[tuple[float, float, float]] = field(default_factory=list)  # (start_s, end_s, GiB held)
    mem_used_spans: list[tuple[float, float, float]] = field(default_factory=list)  # (start_s, end_s, GiB at peak)

    @property
    def mean_act_s(self) -> float:
        return statistics.fmean(self.act_s) if self.act_s else 0.0


@dataclass
class WorkloadResult:
    """One workload's outcome. ``summary`` is its sub-object of the ``--json`` output;
    ``fitted`` holds the distribution parameters measured live (means, spreads, fractions,
    platform latencies, the cluster) that the simulator check runs the workload from."""

    name: str
    runs: list[SystemRun]
    summary: dict[str, Any]
    fitted: dict[str, Any]

    def run_of(self, system: str) -> SystemRun | None:
        """The run of ``system``, or None when this workload did not run it."""
        return next((r for r in self.runs if r.system == system), None)
