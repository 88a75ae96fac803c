"""Sim: the paper's evaluation (shared/PAPER.md) as run specs, and the summary figures.

Scale follows the paper: CPU pool 15 × 256 cores, GPU pool up to 5 × 8 GPUs; coding batch
1280 plus a sweep 256→1536; DeepSearch batch 2048; MOPD with 9 teachers at 2048 and 3072;
the fixed-DoP ablation in a sparse and a dense regime.
"""

from __future__ import annotations

from typing import Any

from arl_tangram.core.resources import MILLICORES_PER_CORE
from arl_tangram.sim.experiments import PAPER_CPU_NODES, PAPER_GPU_NODES, RunSpec, mopd_deployments

CODING_BATCH = 1280  # PAPER: AI coding batch
SWEEP_BATCHES = (256, 512, 768, 1024, 1280, 1536)  # PAPER: gain vs Kubernetes as batch grows 256 → 1536
MOPD_BATCHES = (2048, 3072)  # PAPER
MOPD_GPU_SWEEP = (4, 6, 8, 10, 12, 14, 16, 24, 36)  # pool sizes tried for ARL-Tangram
DEEPSEARCH_GPUS = 16  # assumption: the judge's GPUs (two nodes), the same for both systems
ABLATION_NODES = 2  # assumption: a 512-core pool for the ablation
ABLATION_BATCHES = {"sparse": 48, "dense": 512}  # assumption: lightly and heavily loaded regimes
HEADLINE_FIXED_DOPS = (4, 8, 12, 16, 20, 24, 32)  # fixed DoPs at the headline scale and in the sweep (issue 28: 4-32 missed that 20 comes within 4%)
STEP_GAIN_SEEDS = (1, 2, 3, 4, 5)  # the step gain is reported as mean and minimum over these
PAPER_BATCH_GROWTH = 27.7 / 3.1  # PAPER: ACT gain vs Kubernetes 3.1x at batch 256 -> 27.7x at 1536


def pod_millicores(batch: int = CODING_BATCH, nodes: int = PAPER_CPU_NODES, cores: int = 256) -> int:
    """What an operator would give each pod for the default batch: pool cores / batch, ≥ 1 core."""
    return max(1, (nodes * cores) // batch) * MILLICORES_PER_CORE


def coding_specs(quick: bool = False) -> list[RunSpec]:
    pod = {"pod_millicores": pod_millicores()}
    specs = []
    batches = (256, CODING_BATCH) if quick else SWEEP_BATCHES
    for batch in batches:
        wp = {"batch": batch}
        specs.append(RunSpec("coding", "arl-tangram", "coding", wp, "elastic", cpu_nodes=PAPER_CPU_NODES))
        specs.append(RunSpec("coding", "k8s-static", "coding", wp, "k8s-static", pod, "k8s", cpu_nodes=PAPER_CPU_NODES))
        # An operator who sized pods once for the smallest batch and then raised the batch.
        small = {"pod_millicores": pod_millicores(batches[0])}
        specs.append(RunSpec("coding", "k8s-static-pods-for-smallest-batch", "coding", wp, "k8s-static", small, "k8s", cpu_nodes=PAPER_CPU_NODES))
    wp = {"batch": CODING_BATCH}
    specs.append(RunSpec("coding", "k8s-static+control-plane", "coding", wp, "k8s-static", pod, "k8s+cp", cpu_nodes=PAPER_CPU_NODES))
    specs.append(RunSpec("coding", "ideal", "coding", wp, "ideal", {}, "ideal", cpu_nodes=PAPER_CPU_NODES, cores_per_node=256 * 64))
    for dop in HEADLINE_FIXED_DOPS:
        specs.append(RunSpec("coding-fixed-dop", f"fixed-dop-{dop}", "coding", wp, "fixed-dop", {"dop": dop}, cpu_nodes=PAPER_CPU_NODES))
    for seed in STEP_GAIN_SEEDS[1:2] if quick else STEP_GAIN_SEEDS[1:]:
        specs.append(RunSpec("coding-seeds", f"arl-tangram-seed-{seed}", "coding", wp, "elastic", cpu_nodes=PAPER_CPU_NODES, seed=seed))
        specs.append(RunSpec("coding-seeds", f"k8s-static-seed-{seed}", "coding", wp, "k8s-static", pod, "k8s", cpu_nodes=PAPER_CPU_NODES, seed=seed))
    return specs


# Static judge deployments an operator could pick for 16 GPUs (replicas, GPUs each); the
# baseline is the best of them by step time, so it is never a weakened choice.
DEEPSEARCH_STATIC_DEPLOYMENTS = ((4, 4), (8, 2), (16, 1))


def deepsearch_specs(quick: bool = False) -> list[RunSpec]:
    wp = {"batch": 512 if quick else 2048}
    specs = [RunSpec("deepsearch", "arl-tangram", "deepsearch", wp, "elastic", gpus=DEEPSEARCH_GPUS)]
    for replicas, size in DEEPSEARCH_STATIC_DEPLOYMENTS:
        deploy = {"deployments": {"judge": (replicas, size)}}
        label = f"static-{replicas}x{size}+client-backoff"
        specs.append(RunSpec("deepsearch", label, "deepsearch", wp, "task-pool", deploy, gpus=DEEPSEARCH_GPUS))
    return specs


def mopd_specs(quick: bool = False) -> list[RunSpec]:
    specs = []
    for batch in MOPD_BATCHES[:1] if quick else MOPD_BATCHES:
        wp = {"batch": batch}
        # The static baseline gets every way of using a teacher's 4 GPUs (one TP-4 replica,
        # two TP-2, four TP-1); the summary compares against the best, never a weak one.
        for size in (4, 2, 1):
            deploy = {"deployments": mopd_deployments(wp, size)}
            label = f"sglang-static-{4 // size}x{size}"
            specs.append(RunSpec("mopd", label, "mopd", wp, "task-pool", deploy, gpus=PAPER_GPU_NODES * 8))
        sweep = MOPD_GPU_SWEEP if batch == MOPD_BATCHES[0] else tuple(g for g in MOPD_GPU_SWEEP if g >= 8)
        for gpus in (8, 10, 16) if quick else sweep:
            specs.append(RunSpec("mopd", f"arl-tangram@{gpus}", "mopd", wp, "elastic", gpus=gpus))
    return specs


def ablation_specs(quick: bool = False) -> list[RunSpec]:
    specs = []
    for regime, batch in ABLATION_BATCHES.items():
        wp = {"batch": batch // 4 if quick else batch}
        exp = f"ablation-{regime}"
        specs.append(RunSpec(exp, "elastic", "coding", wp, "elastic", cpu_nodes=ABLATION_NODES))
        for dop in (4, 16):
            specs.append(RunSpec(exp, f"fixed-dop-{dop}", "coding", wp, "fixed-dop", {"dop": dop}, cpu_nodes=ABLATION_NODES))
    return specs


SWE_GROUP = 8  # issue 24: G = 8 rollouts per task
SWE_SPEC_POD = {"pod_millicores": 1000}  # issue 24: the SWE-Gym/OpenReward sandbox spec, 1 CPU / 2 GiB


def swe_specs(quick: bool = False) -> list[RunSpec]:
    """The live SWE workload at the published coding scale (15 x 256 cores, batch 1280):
    tangram (GRPO groups set up once and forked), pods at the framework spec, and pods sized
    to fit the batch (Guaranteed: the simulator has no cpu.shares, so Burstable-fit and its
    OOM kills stay live-only figures). Every pod sets up its own rollout."""
    batch = 256 if quick else CODING_BATCH
    wp = {"batch": batch, "group_size": SWE_GROUP}
    fit = {"pod_millicores": pod_millicores(batch)}
    return [
        RunSpec("swe", "arl-tangram", "swe", {**wp, "fork": True, "env_mem_bytes": 1 << 30}, "elastic", cpu_nodes=PAPER_CPU_NODES),
        RunSpec("swe", "k8s-spec", "swe", wp, "k8s-static", SWE_SPEC_POD, "k8s", cpu_nodes=PAPER_CPU_NODES),
        RunSpec("swe", "k8s-guaranteed-fit", "swe", wp, "k8s-static", fit, "k8s", cpu_nodes=PAPER_CPU_NODES),
    ]


def all_specs(quick: bool = False) -> list[RunSpec]:
    return coding_specs(quick) + deepsearch_specs(quick) + mopd_specs(quick) + ablation_specs(quick) + swe_specs(quick)


def swe_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The SWE workload at paper scale: ACT (set-up out, as live) and step gains of tangram
    against each pod sizing; {} when the run had no swe rows."""
    found = {r["label"]: r for r in rows if r["experiment"] == "swe"}
    if "arl-tangram" not in found:
        return {}
    t = found["arl-tangram"]

    def act(row: dict[str, Any]) -> float:
        cats = [c for c in row["act_by_category"] if c != "setup"]
        n = sum(row["act_by_category"][c]["count"] for c in cats)
        return sum(row["act_by_category"][c]["mean_s"] * row["act_by_category"][c]["count"] for c in cats) / n if n else float("nan")

    pods = {label: row for label, row in found.items() if label != "arl-tangram"}
    return {
        "swe_act_gain_vs": {label: act(row) / act(t) for label, row in sorted(pods.items())},
        "swe_step_gain_vs": {label: row["step_s"] / t["step_s"] for label, row in sorted(pods.items())},
        "swe_batch": t["batch"],
    }


def _find(rows: list[dict[str, Any]], experiment: str, label: str, batch: int | None = None) -> dict[str, Any]:
    for row in rows:
        if row["experiment"] == experiment and row["label"] == label and (batch is None or row["batch"] == batch):
            return row
    raise KeyError((experiment, label, batch))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures named in the issue, each a ratio measured side by side in one run."""
    tangram = _find(rows, "coding", "arl-tangram", CODING_BATCH)
    k8s = _find(rows, "coding", "k8s-static", CODING_BATCH)
    k8s_cp = _find(rows, "coding", "k8s-static+control-plane", CODING_BATCH)
    ideal = _find(rows, "coding", "ideal", CODING_BATCH)
    by_batch, by_batch_small = {}, {}
    for row in rows:
        if row["experiment"] == "coding" and row["label"] == "arl-tangram":
            base = _find(rows, "coding", "k8s-static", row["batch"])
            by_batch[str(row["batch"])] = base["act"]["mean_s"] / row["act"]["mean_s"]
            small = _find(rows, "coding", "k8s-static-pods-for-smallest-batch", row["batch"])
            by_batch_small[str(row["batch"])] = small["act"]["mean_s"] / row["act"]["mean_s"]
    ds_t = _find(rows, "deepsearch", "arl-tangram")
    ds_b = min((r for r in rows if r["experiment"] == "deepsearch" and r["policy"] != "elastic"), key=lambda r: r["step_s"])
    mopd_rows = [r for r in rows if r["experiment"] == "mopd" and r["batch"] == MOPD_BATCHES[0]]
    mopd_static = min((r for r in mopd_rows if r["policy"] != "elastic"), key=lambda r: r["act"]["p50_s"])
    mopd_tp4 = next(r for r in mopd_rows if r["label"] == "sglang-static-1x4")

    def fewest_gpus(static: dict[str, Any]) -> int | None:
        fits = sorted(r["gpus"] for r in mopd_rows if r["policy"] == "elastic" and r["act"]["p50_s"] <= static["act"]["p50_s"])
        return fits[0] if fits else None

    fewest = fewest_gpus(mopd_static)
    return {
        **_headline_fixed_dop(rows, tangram),
        **_step_gain_over_seeds(rows, tangram, k8s),
        **_batch_growth(by_batch, by_batch_small),
        "coding_act_gain": k8s["act"]["mean_s"] / tangram["act"]["mean_s"],
        "coding_act_gain_with_control_plane": k8s_cp["act"]["mean_s"] / tangram["act"]["mean_s"],
        "coding_env_act_gain": k8s["act_by_category"]["env"]["mean_s"] / tangram["act_by_category"]["env"]["mean_s"],
        "coding_reward_act_gain": k8s["act_by_category"]["reward"]["mean_s"] / tangram["act_by_category"]["reward"]["mean_s"],
        "coding_gain_by_batch": dict(sorted(by_batch.items(), key=lambda kv: int(kv[0]))),
        "coding_gain_grows": by_batch[str(max(map(int, by_batch)))] > by_batch[str(min(map(int, by_batch)))],
        "coding_step_gain": k8s["step_s"] / tangram["step_s"],
        "coding_step_gain_with_control_plane": k8s_cp["step_s"] / tangram["step_s"],
        "deepsearch_step_gain": ds_b["step_s"] / ds_t["step_s"],
        "deepsearch_best_static": ds_b["label"],
        "mopd_gpus_static": sum(count * size for count, size in mopd_deployments({"batch": MOPD_BATCHES[0]}).values()),
        "mopd_gpus_tangram": fewest,
        "mopd_best_static": mopd_static["label"],
        "mopd_static_p50_s": mopd_static["act"]["p50_s"],
        "mopd_gpus_tangram_vs_tp4_static": fewest_gpus(mopd_tp4),
        "mopd_act_gain_static_vs_tangram_at_fewest": (
            mopd_static["act"]["mean_s"] / _find(rows, "mopd", f"arl-tangram@{fewest}", MOPD_BATCHES[0])["act"]["mean_s"]
            if fewest else None
        ),
        "ablation_elastic_best": all(
            _find(rows, f"ablation-{regime}", "elastic")["act"]["mean_s"]
            < min(_find(rows, f"ablation-{regime}", f"fixed-dop-{d}")["act"]["mean_s"] for d in (4, 16))
            for regime in ABLATION_BATCHES
        ),
        "coding_ideal_ratio": tangram["act"]["mean_s"] / ideal["act"]["mean_s"],
        **swe_summary(rows),
    }


def _headline_fixed_dop(rows: list[dict[str, Any]], tangram: dict[str, Any]) -> dict[str, Any]:
    """Elastic against every fixed DoP at the headline scale (15 x 256 cores, batch 1280)."""
    fixed = {d: _find(rows, "coding-fixed-dop", f"fixed-dop-{d}")["act"]["mean_s"] for d in HEADLINE_FIXED_DOPS}
    best = min(fixed, key=lambda d: fixed[d])
    return {
        "coding_fixed_dop_act_s": {str(d): v for d, v in fixed.items()},
        "coding_elastic_act_s": tangram["act"]["mean_s"],
        "headline_margin_vs_best_fixed": fixed[best] / tangram["act"]["mean_s"],
        "headline_best_fixed_dop": best,
    }


def _step_gain_over_seeds(rows: list[dict[str, Any]], tangram: dict[str, Any], k8s: dict[str, Any]) -> dict[str, Any]:
    gains = [k8s["step_s"] / tangram["step_s"]]
    for row in rows:
        if row["experiment"] == "coding-seeds" and row["policy"] == "elastic":
            seed = row["label"].rsplit("-", 1)[1]
            gains.append(_find(rows, "coding-seeds", f"k8s-static-seed-{seed}")["step_s"] / row["step_s"])
    return {"coding_step_gain_mean_over_seeds": sum(gains) / len(gains), "coding_step_gain_min_over_seeds": min(gains), "coding_step_gain_seeds": len(gains)}


def _batch_growth(by_batch: dict[str, float], by_batch_small: dict[str, float]) -> dict[str, Any]:
    """Both pod sizings and which one's growth (last / first batch) is nearer the paper's."""
    def growth(gains: dict[str, float]) -> float:
        keys = sorted(gains, key=int)
        return gains[keys[-1]] / gains[keys[0]]

    g_default, g_small = growth(by_batch), growth(by_batch_small)
    nearer = "pods-for-smallest-batch" if abs(g_small - PAPER_BATCH_GROWTH) < abs(g_default - PAPER_BATCH_GROWTH) else "pods-for-default-batch"
    return {
        "coding_gain_by_batch_pods_for_smallest_batch": dict(sorted(by_batch_small.items(), key=lambda kv: int(kv[0]))),
        "coding_gain_growth_pods_for_default_batch": g_default,
        "coding_gain_growth_pods_for_smallest_batch": g_small,
        "coding_gain_growth_paper": PAPER_BATCH_GROWTH,
        "coding_gain_growth_nearer_paper": nearer,
    }


TARGETS = {
    "coding_act_gain": (">=", 4.3),
    "coding_gain_grows": ("==", True),
    "coding_step_gain": (">=", 1.4),
    "coding_step_gain_min_over_seeds": (">=", 1.4),
    "headline_margin_vs_best_fixed": (">=", 1.05),
    "deepsearch_step_gain": (">=", 1.5),
    "mopd_gpus_tangram": ("<=", 10),
    "ablation_elastic_best": ("==", True),
    "coding_ideal_ratio": ("<=", 1.2),
}


def check_targets(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for key, (op, target) in TARGETS.items():
        value = summary.get(key)
        if value is None:
            met = False
        elif op == ">=":
            met = value >= target
        elif op == "<=":
            met = value <= target
        else:
            met = value == target
        out[key] = {"value": value, "target": f"{op} {target}", "met": bool(met)}
    return out
