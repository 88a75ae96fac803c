"""Shell: the report of ``arl-tangram bench live``: a side-by-side table per workload, the
simulator check beside the live figures, the ``--json`` object, and PNG plots (ACT CDF per
workload; CPU cores reserved vs used over time) written with matplotlib's Agg backend.

Pure apart from ``write_plots`` (files). Called by ``bench.live.main`` after the workloads.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arl_tangram.bench.live.common import SystemRun, WorkloadResult
from arl_tangram.bench.live.headline import headline

WORKLOADS = ("swe", "coding", "mopd", "deepsearch")  # swe first: the agentic-RL workload people train on
MIB = 1 << 20


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; nan for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


HEADER = (
    f"{'system':<16} {'n':>5} {'ACT mean':>9} {'p50':>8} {'p99':>8} {'queue':>8} {'exec':>8} {'ovhd':>8}"
    f" {'step s':>8} {'core-s res':>10} {'core-s used':>11} {'dev MiB':>8} {'429s':>5}"
)


def system_row(run: SystemRun) -> str:
    """One line of the table: ACT in seconds (mean / p50 / p99, then the mean's split)."""
    return (
        f"{run.system:<16} {len(run.act_s):>5} {_mean(run.act_s):>9.3f} {quantile(run.act_s, 0.5):>8.3f}"
        f" {quantile(run.act_s, 0.99):>8.3f} {_mean(run.queue_s):>8.3f} {_mean(run.exec_s):>8.3f}"
        f" {_mean(run.overhead_s):>8.3f} {run.step_s:>8.2f} {run.core_s_reserved:>10.1f} {run.core_s_used:>11.1f}"
        f" {run.device_bytes / MIB:>8.0f} {run.leaked_429:>5d}"
    )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def workload_table(result: WorkloadResult) -> str:
    """The side-by-side table of one workload, then its summary figures."""
    lines = [f"== {result.name} ==", HEADER]
    lines += [system_row(run) for run in result.runs]
    lines += [f"{name:<16} {why}" for name, why in result.summary.get("not_run_systems", {}).items()]
    long = ("parameters", "per_system", "by_kind", "not_run_systems")  # in the JSON; too wide for the table (or a row above)
    scalars = {k: v for k, v in result.summary.items() if not isinstance(v, list) and k not in long}
    lines.append("  " + "; ".join(f"{k} = {_fmt(v)}" for k, v in scalars.items()))
    if isinstance(result.summary.get("parameters"), dict):  # assumptions, printed so a reader can rerun with others
        lines.append("  parameters: " + _fmt(result.summary["parameters"]))
    return "\n".join(lines)


def render(
    results: Sequence[WorkloadResult], not_run: dict[str, str], simcheck: dict[str, dict[str, float]], wall_s: float,
    phases_s: dict[str, float] | None = None,
) -> str:  # fmt: skip
    """The whole text report: ACT columns in seconds, a row per system."""
    parts = [workload_table(r) for r in results]
    parts += [f"== {name} == not run: {why}" for name, why in not_run.items()]
    if simcheck:
        lines = ["== simulator check (policy elastic, fitted parameters) ==",
                 f"{'workload':<12} {'sim ACT s':>10} {'live ACT s':>11} {'sim/live':>9}"]  # fmt: skip
        for name, row in simcheck.items():
            lines.append(f"{name:<12} {row['sim_mean_act_s']:>10.3f} {row['live_mean_act_s']:>11.3f} {row['ratio']:>9.2f}")
        parts.append("\n".join(lines))
    if results:
        parts.append(headline(results))
    where = f" ({', '.join(f'{k} {v:.1f} s' for k, v in phases_s.items())})" if phases_s else ""
    parts.append(f"wall time: {wall_s:.1f} s{where}")
    return "\n\n".join(parts)


def json_object(
    results: Sequence[WorkloadResult], not_run: dict[str, str], simcheck: dict[str, dict[str, float]],
    wall_s: float, extra: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``{"coding": {...}, "mopd": {...}, "deepsearch": {...}, "sim_vs_live_act_ratio":
    {...}, "wall_s"}``; a workload that did not run is ``{"not_run": why}``."""
    out: dict[str, Any] = {r.name: dict(r.summary) for r in results}
    for name, why in not_run.items():
        out[name] = {"not_run": why}
    out["sim_vs_live_act_ratio"] = {name: row["ratio"] for name, row in simcheck.items()}
    out["simcheck"] = simcheck
    out["fitted"] = {r.name: r.fitted for r in results}
    out.update(extra or {})
    out["wall_s"] = wall_s
    return out


# -- plots -------------------------------------------------------------------------------
def _cores_over_time(spans: Sequence[tuple[float, float, float]], end_s: float, step_s: float, rate: bool) -> list[float]:
    """Cores per time bin: spans of held cores (``rate`` False) or of core-seconds spread
    evenly over the span (``rate`` True)."""
    bins = [0.0] * (int(end_s / step_s) + 1)
    for start, stop, amount in spans:
        if stop <= start:
            continue
        per_s = amount / (stop - start) if rate else amount
        for i in range(int(start / step_s), min(len(bins), int(stop / step_s) + 1)):
            lo, hi = max(start, i * step_s), min(stop, (i + 1) * step_s)
            if hi > lo:
                bins[i] += per_s * (hi - lo) / step_s
    return bins


def write_plots(results: Sequence[WorkloadResult], report_dir: Path) -> list[Path]:
    """``<workload>_act_cdf.png`` per workload, ``<workload>_cpu.png`` where the runs
    recorded CPU spans and ``<workload>_mem.png`` where they recorded memory spans; returns
    the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for result in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in result.runs:
            xs = sorted(run.act_s)
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=run.system)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set(xlabel="action completion time (s)", ylabel="fraction of actions", title=f"{result.name}: ACT CDF")
        ax.legend()
        ax.grid(alpha=0.3)
        written.append(_save(fig, report_dir / f"{result.name}_act_cdf.png"))
        plt.close(fig)
        spanned = [r for r in result.runs if r.reserved_spans or r.used_spans]
        if spanned:
            written.append(_cpu_plot(plt, result.name, spanned, report_dir))
        with_mem = [r for r in result.runs if r.mem_reserved_spans or r.mem_used_spans]
        if with_mem:
            written.append(_mem_plot(plt, result.name, with_mem, report_dir))
    return written


def _cpu_plot(plt: Any, name: str, runs: list[SystemRun], report_dir: Path) -> Path:
    """Cores reserved vs used (CPU seconds as a rate) over time, per system."""
    return _over_time_plot(
        plt, name, runs, report_dir, lambda r: (r.reserved_spans, r.used_spans),
        unit="cores", used_label="used", used_rate=True, what="cpu", title="CPU cores reserved vs used",
    )  # fmt: skip


def _mem_plot(plt: Any, name: str, runs: list[SystemRun], report_dir: Path) -> Path:
    """GiB reserved (held) vs used (each action's peak over its run) over time, per system."""
    return _over_time_plot(
        plt, name, runs, report_dir, lambda r: (r.mem_reserved_spans, r.mem_used_spans),
        unit="GiB", used_label="used (peak)", used_rate=False, what="mem", title="memory reserved vs used",
    )  # fmt: skip


def _over_time_plot(
    plt: Any, name: str, runs: list[SystemRun], report_dir: Path, spans_of: Any,
    *, unit: str, used_label: str, used_rate: bool, what: str, title: str,
) -> Path:  # fmt: skip
    """One panel per system: its reserved and used spans (``spans_of(run)``) sampled over time."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 2.2 * len(runs)), sharex=True, squeeze=False)
    end_s = max(max((s[1] for s in sum(spans_of(r), [])), default=0.0) for r in runs)
    step_s = max(0.1, end_s / 200)
    times = [i * step_s for i in range(int(end_s / step_s) + 1)]
    for ax, run in zip(axes[:, 0], runs, strict=True):
        reserved, used = spans_of(run)
        ax.plot(times, _cores_over_time(reserved, end_s, step_s, rate=False), label="reserved")
        ax.plot(times, _cores_over_time(used, end_s, step_s, rate=used_rate), label=used_label)
        ax.set(ylabel=unit, title=run.system)
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the system's start")
    fig.suptitle(f"{name}: {title}")
    path = _save(fig, report_dir / f"{name}_{what}.png")
    plt.close(fig)
    return path


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
