"""Shell: ``arl-tangram sim sweep``: the coding experiment under perturbed workloads and seeds.

At the paper's scale (15 × 256 cores, batch 1280), each workload parameter is set to ×0.5
and ×2 of its default, one at a time (at the seed set's first seed), plus one setting per
seed of ``--seed-set`` at defaults. Every setting runs elastic, fixed DoP 4/8/12/16/20/24/32
(the headline's grid, ``paper.HEADLINE_FIXED_DOPS``), Kubernetes with and without
control-plane costs, the unlimited ideal, and, on elastic's own arrivals, the capacity bound
(``sim/bound.py``) and processor sharing (``sim/processor_sharing.py``). Nothing is tuned per
setting: every policy keeps its defaults.

Two views of elastic against fixed DoPs: per setting, the margin over the hindsight-best
fixed DoP; per fixed DoP, its worst mean-ACT ratio over elastic across the settings (its
regret), and the best single fixed DoP's worst case (``min_worst_regret``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from arl_tangram.sim.experiments import PAPER_CPU_NODES, RunSpec, run_all
from arl_tangram.sim.paper import CODING_BATCH, HEADLINE_FIXED_DOPS, pod_millicores
from arl_tangram.sim.workloads.coding import CodingParams

# Parameters the issue names, as CodingParams fields.
PERTURBED = ("think_mean_s", "command_mean_s", "test_fraction", "test_t_ori_mean_s", "test_serial_fraction", "reward_t_ori_mean_s", "sigma")
FACTORS = (0.5, 2.0)
FIXED_DOPS = HEADLINE_FIXED_DOPS
SEED_SETS = {"default": (1, 2, 3, 4, 5), "second": (11, 13, 17, 19, 23)}  # issue 28: a change must hold on both
MARGIN_SLACK = 1.01  # elastic "beats" the best fixed DoP when within 1% of it (the rule)


def settings(seeds: int | tuple[int, ...] = 5) -> list[tuple[str, dict[str, Any], int]]:
    """(name, workload params, seed) for every setting: each seed at defaults, then every
    perturbation at the first seed. An int ``n`` means seeds 1..n."""
    seed_list = tuple(range(1, seeds + 1)) if isinstance(seeds, int) else seeds
    defaults = CodingParams().describe()
    out: list[tuple[str, dict[str, Any], int]] = [(f"seed-{s}", {"batch": CODING_BATCH}, s) for s in seed_list]
    for name in PERTURBED:
        for factor in FACTORS:
            value = float(defaults[name]) * factor  # type: ignore[arg-type]
            if name == "test_fraction":
                value = min(1.0, value)
            out.append((f"{name}x{factor:g}", {"batch": CODING_BATCH, name: value}, seed_list[0]))
    return out


def specs_for(name: str, wp: dict[str, Any], seed: int, batch_scale: float = 1.0, elastic: dict[str, Any] | None = None) -> list[RunSpec]:
    """``elastic``: the elastic run's policy params (``--preempt-quantum-s``: issue 26's preemption)."""
    wp = dict(wp, batch=max(8, int(wp["batch"] * batch_scale)))
    nodes = max(1, round(PAPER_CPU_NODES * batch_scale))
    pod = {"pod_millicores": pod_millicores(wp["batch"], nodes)}
    runs = [RunSpec(name, "elastic", "coding", wp, "elastic", dict(elastic or {}), "tangram", nodes, seed=seed, bound=True)]
    runs += [RunSpec(name, f"fixed-dop-{d}", "coding", wp, "fixed-dop", {"dop": d}, "tangram", nodes, seed=seed) for d in FIXED_DOPS]
    runs.append(RunSpec(name, "k8s-static", "coding", wp, "k8s-static", pod, "k8s", nodes, seed=seed))
    runs.append(RunSpec(name, "k8s-static+control-plane", "coding", wp, "k8s-static", pod, "k8s+cp", nodes, seed=seed))
    runs.append(RunSpec(name, "ideal", "coding", wp, "ideal", {}, "ideal", nodes, cores_per_node=256 * 64, seed=seed))
    return runs


def setting_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting's figures from its rows (all share one experiment name)."""
    by = {r["label"]: r for r in rows}
    elastic = by["elastic"]["act"]["mean_s"]
    fixed = {d: by[f"fixed-dop-{d}"]["act"]["mean_s"] for d in FIXED_DOPS}
    best_dop = min(fixed, key=lambda d: fixed[d])
    ps = by["elastic"].get("processor_sharing", {}).get("mean_s")
    return {
        "elastic_act_s": elastic,
        "fixed_act_s": {str(d): v for d, v in fixed.items()},
        "best_fixed_dop": best_dop,
        "margin_vs_best_fixed": fixed[best_dop] / elastic,
        "elastic_beats_all_fixed": elastic <= MARGIN_SLACK * fixed[best_dop],
        "k8s_act_s": by["k8s-static"]["act"]["mean_s"],
        "k8s_cp_act_s": by["k8s-static+control-plane"]["act"]["mean_s"],
        "ideal_act_s": by["ideal"]["act"]["mean_s"],
        "bound_act_s": by["elastic"]["bound"]["mean_s"],
        "bound_ideal_same_arrivals_s": by["elastic"]["bound"]["ideal_mean_s"],
        "bound_ratio": elastic / by["elastic"]["bound"]["mean_s"],
        "step_gain": by["k8s-static"]["step_s"] / by["elastic"]["step_s"],
        "act_gain": by["k8s-static"]["act"]["mean_s"] / elastic,
        "k8s_env_busy_fraction": by["k8s-static"]["env_busy_fraction"],
        # processor sharing (issue 26) on elastic's own arrivals, as the bound
        "processor_sharing_act_s": ps,
        "elastic_vs_processor_sharing": None if ps is None else ps / elastic,
        # the most that ratio can be for any schedule that fixes each run's DoP (elastic
        # does) on these arrivals: elastic's mean ACT is never below the bound
        "processor_sharing_vs_bound": None if ps is None else ps / by["elastic"]["bound"]["mean_s"],
        # the most that ratio can be for any schedule at all, preemptive or malleable: no
        # action ends before its arrival + overhead + its fastest duration (the bound at λ = 0)
        "processor_sharing_vs_ideal": None if ps is None else ps / by["elastic"]["bound"]["ideal_mean_s"],
    }


def summarize(per_setting: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sweep's claims. The headline is the first seed's setting; the regrets are over
    the sweep's base settings only (``regret_settings``), so adding settings cannot move them.
    (A ``--settings`` run without a seed setting takes its first setting as the headline.)"""
    seeds = [v for k, v in per_setting.items() if k.startswith("seed-")] or list(per_setting.values())[:1]
    head = seeds[0]
    gains = [s["step_gain"] for s in seeds]
    base = {k: per_setting[k] for k in regret_settings(per_setting)}
    regrets = worst_regret_by_fixed_dop(base)
    among_fixed = worst_regret_by_fixed_dop(base, against_best_fixed=True)
    return {
        "elastic_beats_all_fixed_fraction": sum(s["elastic_beats_all_fixed"] for s in per_setting.values()) / len(per_setting),
        "headline_margin_vs_best_fixed": head["margin_vs_best_fixed"],
        "headline_best_fixed_dop": head["best_fixed_dop"],
        "coding_bound_ratio": head["bound_ratio"],
        "step_gain_min_over_seeds": min(gains),
        "step_gain_mean_over_seeds": sum(gains) / len(gains),
        "margin_min": min(s["margin_vs_best_fixed"] for s in per_setting.values()),
        **_versus_processor_sharing(per_setting),
        "settings_missed": sorted(k for k, s in per_setting.items() if not s["elastic_beats_all_fixed"]),
        "worst_regret_by_fixed_dop": regrets,
        "min_worst_regret": min(r["ratio"] for r in regrets.values()),
        "min_worst_regret_dop": int(min(regrets, key=lambda d: regrets[d]["ratio"])),
        # The same with each setting's hindsight-best fixed DoP in elastic's place: what the
        # settings themselves allow. min_worst_regret <= this x the largest margin over them.
        "min_worst_regret_vs_best_fixed": min(r["ratio"] for r in among_fixed.values()),
        "min_worst_regret_ceiling": min(r["ratio"] for r in among_fixed.values()) * max(s["margin_vs_best_fixed"] for s in base.values()),
    }


def _versus_processor_sharing(per_setting: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Elastic against processor sharing: the worst setting, and its ceiling.

    ``processor_sharing_vs_bound_min`` is the minimum over the settings of processor
    sharing's mean ACT over the capacity bound on the same arrivals. No schedule that fixes
    each run's DoP can show ``processor sharing / its mean ACT`` above that setting's ratio,
    so a target for ``elastic_vs_processor_sharing_min`` above this minimum is out of reach
    of every such policy (where the cores are rarely short, processor sharing is already
    near the bound: it has nothing to queue). ``processor_sharing_vs_ideal_min`` is the same
    over the no-capacity ideal on the same arrivals (every action alone at its fastest DoP),
    which no schedule beats, preemptive, malleable or otherwise: a target above it is out of
    reach of every policy. Caveat as the bound's: on the arrivals the elastic run saw (a
    closed loop under another schedule would shift them)."""
    out: dict[str, Any] = {}
    for key in ("elastic_vs_processor_sharing", "processor_sharing_vs_bound", "processor_sharing_vs_ideal"):
        values = {name: v for name, s in per_setting.items() if (v := s.get(key)) is not None}
        out[f"{key}_min"] = min(values.values(), default=float("nan"))
        out[f"{key}_worst_setting"] = min(values, key=lambda name: values[name], default=None)
    return out


def regret_settings(per_setting: dict[str, Any]) -> list[str]:
    """The base settings the regrets are taken over: the first ``len(SEED_SETS["default"])``
    seeds at defaults and every perturbation (19 with the defaults)."""
    seeds = [k for k in per_setting if k.startswith("seed-")][: len(SEED_SETS["default"])]
    return seeds + [k for k in per_setting if not k.startswith("seed-")]


def worst_regret_by_fixed_dop(per_setting: dict[str, dict[str, Any]], against_best_fixed: bool = False) -> dict[str, dict[str, Any]]:
    """For each fixed DoP, its largest mean-ACT ratio over elastic across ``per_setting``
    (``fixed / elastic``; above 1 elastic was faster there) and the setting where it fell;
    ``against_best_fixed``: over each setting's hindsight-best fixed DoP instead of elastic.

    Why both: ``fixed / elastic = fixed / best fixed × margin``, so the best single fixed
    DoP's worst case over elastic is at most its worst case over the best fixed DoP times
    elastic's largest margin. The first factor belongs to the settings, not to the policy."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in per_setting.items():
        reference = s["fixed_act_s"][str(s["best_fixed_dop"])] if against_best_fixed else s["elastic_act_s"]
        for dop, act_s in s["fixed_act_s"].items():
            ratio = act_s / reference
            if dop not in out or ratio > out[dop]["ratio"]:
                out[dop] = {"ratio": ratio, "setting": name}
    return out


TARGETS = {
    "elastic_beats_all_fixed_fraction": (">=", 1.0),
    "headline_margin_vs_best_fixed": (">=", 1.05),
    "coding_bound_ratio": ("<=", 1.2),
    "step_gain_min_over_seeds": (">=", 1.4),
    "min_worst_regret": (">=", 1.3),
    "wall_s": ("<=", 900.0),  # the 15-minute budget on the project's 2-core host
    "elastic_vs_processor_sharing_min": (">=", 1.1),
}


def _progress_bar(total: int) -> Any:
    done = [0]
    t0 = time.perf_counter()

    def tick(row: dict[str, Any]) -> None:
        done[0] += 1
        width = 30
        filled = width * done[0] // total
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done[0]}/{total} {time.perf_counter() - t0:6.0f} s  "
              f"{row['experiment'][:22]:<22} {row['label'][:24]:<24}", end="" if done[0] < total else "\n", file=sys.stderr, flush=True)

    return tick


def plot_margins(per_setting: dict[str, dict[str, Any]], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(per_setting)
    margins = [per_setting[n]["margin_vs_best_fixed"] for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = ["tab:green" if per_setting[n]["elastic_beats_all_fixed"] else "tab:red" for n in names]
    ax.bar(range(len(names)), margins, color=colors)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.05, color="grey", linestyle="--", linewidth=0.8, label="headline target 1.05")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{n} (dop {per_setting[n]['best_fixed_dop']})" for n in names], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("best fixed DoP mean ACT / elastic")
    ax.set_title("AI coding 15 x 256 cores, batch 1280: elastic vs the best fixed DoP per setting")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram sim sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..n at defaults (at least 5 for the summary's claims)")
    parser.add_argument("--seed-set", choices=sorted(SEED_SETS), help="a named seed set instead of --seeds (second: 11,13,17,19,23)")
    parser.add_argument("--settings", default="", help="comma-separated setting names to run only (development; the summary covers what ran)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="worker processes (default: one per core)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the scale (batch 128 on 2 nodes): a smoke run")
    parser.add_argument("--report-dir", default="reports/sweep")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--preempt-quantum-s", type=float, default=None, help="run elastic with preemption at this quantum (issue 26)")
    args = parser.parse_args(argv)
    if args.preempt_quantum_s is not None and not args.preempt_quantum_s > 0:
        parser.error("--preempt-quantum-s: must be > 0 seconds")
    elastic = {} if args.preempt_quantum_s is None else {"preempt_quantum_s": args.preempt_quantum_s}

    t0 = time.perf_counter()
    scale = 0.1 if args.quick else 1.0
    chosen = settings(SEED_SETS[args.seed_set] if args.seed_set else args.seeds)
    if args.settings:
        only = set(args.settings.split(","))
        if unknown := only - {name for name, _, _ in chosen}:
            parser.error(f"--settings: unknown setting(s) {sorted(unknown)}; known: {[n for n, _, _ in chosen]}")
        chosen = [c for c in chosen if c[0] in only]
    specs = [s for name, wp, seed in chosen for s in specs_for(name, wp, seed, scale, elastic)]
    rows = run_all(specs, args.workers, _progress_bar(len(specs)))
    per_setting = {name: setting_figures([r for r in rows if r["experiment"] == name]) for name in dict.fromkeys(r["experiment"] for r in rows)}
    summary = summarize(per_setting)
    summary["wall_s"] = time.perf_counter() - t0
    summary["runs"] = len(rows)
    summary["cpu_s"] = sum(r["cpu_s"] for r in rows)  # the sweep's work: wall on an idle host ≈ cpu_s / workers + the tail
    targets = {k: {"value": summary[k], "target": f"{op} {v}", "met": summary[k] >= v if op == ">=" else summary[k] <= v} for k, (op, v) in TARGETS.items()}
    plot = None if args.no_plots else plot_margins(per_setting, os.path.join(args.report_dir, "sweep_margins.png"))
    result = {"summary": summary, "targets": targets, "settings": per_setting, "plot": plot, "quick": args.quick, "elastic_params": elastic}
    os.makedirs(args.report_dir, exist_ok=True)
    with open(os.path.join(args.report_dir, "sweep.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    if args.json:
        print(json.dumps(result))
        return 0
    for name, s in per_setting.items():
        print(f"{name:<28} elastic {s['elastic_act_s']:.3f}  best fixed {s['best_fixed_dop']:>2} {s['fixed_act_s'][str(s['best_fixed_dop'])]:.3f}"
              f"  margin {s['margin_vs_best_fixed']:.3f}  bound {s['bound_act_s']:.3f}  ideal {s['ideal_act_s']:.3f}  step gain {s['step_gain']:.2f}")
    for dop, r in summary["worst_regret_by_fixed_dop"].items():
        print(f"fixed DoP {dop:>2}: worst {r['ratio']:.3f} x elastic at {r['setting']}")
    print(f"best single fixed DoP's worst case against each setting's best fixed DoP: {summary['min_worst_regret_vs_best_fixed']:.3f}"
          f" (so min_worst_regret <= {summary['min_worst_regret_ceiling']:.3f} at these margins)")
    for key, t in targets.items():
        print(f"{key}: {t['value']:.3f}  target {t['target']}: {'met' if t['met'] else 'MISSED'}")
    print(f"processor sharing / capacity bound, worst setting: {summary['processor_sharing_vs_bound_min']:.3f}"
          f" at {summary['processor_sharing_vs_bound_worst_setting']} (the most elastic_vs_processor_sharing_min can be)")
    print(f"processor sharing / no-capacity ideal, worst setting: {summary['processor_sharing_vs_ideal_min']:.3f}"
          f" at {summary['processor_sharing_vs_ideal_worst_setting']} (the most any schedule's ratio can be, preemptive included)")
    print(f"wall {summary['wall_s']:.0f} s; plot {plot}")
    return 0
