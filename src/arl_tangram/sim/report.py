"""Sim: the report of a paper run: text tables per experiment and PNG plots."""

from __future__ import annotations

import os
from typing import Any


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{nd}f}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def table(rows: list[dict[str, Any]], experiment: str) -> str:
    """One experiment's rows: ACT (mean/p50/p99 and its split), step, resources reserved/used."""
    picked = [r for r in rows if r["experiment"] == experiment]
    head = ["system", "batch", "gpus", "ACT mean", "p50", "p99", "queue", "exec", "overhead", "step s", "reserved", "used"]
    lines = [head]
    for r in picked:
        a = r["act"]
        res = r.get("cpu") or r.get("gpu") or {}
        unit = "cores" if "cpu" in r else "GPUs"
        lines.append([
            r["label"], _fmt(r["batch"]), _fmt(r["gpus"] or None),
            _fmt(a.get("mean_s")), _fmt(a.get("p50_s")), _fmt(a.get("p99_s")),
            _fmt(a.get("queue_s")), _fmt(a.get("exec_s")), _fmt(a.get("overhead_s")),
            _fmt(r["step_s"], 1),
            f"{_fmt(res.get('reserved_mean'), 1)} {unit}" if res else "-",
            f"{_fmt(res.get('used_mean'), 1)} {unit}" if res else "-",
        ])
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    text = [f"== {experiment} =="]
    for row in lines:
        text.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(text)


def summary_table(checks: dict[str, dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = ["== summary (targets from the issue; measured in this run) =="]
    for key, value in summary.items():
        check = checks.get(key)
        mark = "" if check is None else f"  target {check['target']}: {'met' if check['met'] else 'MISSED'}"
        shown = {k: _fmt(v, 2) for k, v in value.items()} if isinstance(value, dict) else _fmt(value, 3)
        lines.append(f"{key}: {shown}{mark}")
    return "\n".join(lines)


def plots(rows: list[dict[str, Any]], summary: dict[str, Any], out_dir: str) -> list[str]:
    """ACT CDFs, CPU reserved/used over time, gain by batch, MOPD p50 vs GPUs. Returns paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["experiment"] == "coding" and r["batch"] == 1280 and r["act_quantiles"]:
            q = r["act_quantiles"]
            ax.plot(q, [i / (len(q) - 1) for i in range(len(q))], label=r["label"])
    ax.set_xscale("log")
    ax.set_xlabel("action completion time (s)")
    ax.set_ylabel("CDF")
    ax.set_title("AI coding, batch 1280: ACT")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir, "coding_act_cdf.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["experiment"] == "coding" and r["batch"] == 1280 and r["label"] in ("arl-tangram", "k8s-static") and "cpu_series" in r:
            t, reserved, used = r["cpu_series"]
            ax.plot(t, reserved, label=f"{r['label']} reserved")
            ax.plot(t, used, linestyle="--", label=f"{r['label']} used")
    ax.set_xlabel("time in step (s)")
    ax.set_ylabel("cores")
    ax.set_title("AI coding, batch 1280: CPU reserved vs used")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir, "coding_cpu_utilisation.png"))

    gains = summary.get("coding_gain_by_batch", {})
    if gains:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([int(b) for b in gains], list(gains.values()), marker="o")
        ax.set_xlabel("batch (trajectories)")
        ax.set_ylabel("k8s mean ACT / ARL-Tangram mean ACT")
        ax.set_title("ACT gain vs Kubernetes by batch")
        paths.append(_save(fig, out_dir, "coding_gain_by_batch.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for batch in sorted({r["batch"] for r in rows if r["experiment"] == "mopd"}):
        pts = sorted((r["gpus"], r["act"]["p50_s"]) for r in rows if r["experiment"] == "mopd" and r["batch"] == batch and r["policy"] == "elastic")
        static = [r for r in rows if r["experiment"] == "mopd" and r["batch"] == batch and r["policy"] != "elastic"]
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"ARL-Tangram, batch {batch}")
        if static:
            best = min(static, key=lambda r: r["act"]["p50_s"])
            ax.axhline(best["act"]["p50_s"], linestyle="--", color=line[0].get_color(), label=f"best static 36 GPUs ({best['label'][14:]}), batch {batch}")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the pool")
    ax.set_ylabel("p50 ACT (s)")
    ax.set_title("MOPD: teacher log-prob ACT vs GPUs")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir, "mopd_p50_vs_gpus.png"))
    return paths


def _save(fig: Any, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
