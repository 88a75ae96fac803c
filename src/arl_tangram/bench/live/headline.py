"""Shell: the few lines ``arl-tangram bench live`` ends with, for a newcomer: per workload
the baseline compared against, ARL-Tangram's ACT and step gains over it, the resources it
reserved against that baseline's, what either lost, and one sentence saying where it wins
and where it does not.

Pure: reads each ``WorkloadResult.summary`` (keys a workload lacks are shown as "-").
Called by ``report.render`` after the per-workload tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from arl_tangram.bench.live.common import WorkloadResult

WIN = 1.1  # a gain below this is a tie on a shared 2-core host, not a win


def _gain(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, int | float) and math.isfinite(value) else "-"


def _reserved(result: WorkloadResult) -> str:
    """Tangram's reservation over the baseline's: the normalised core + memory ratio where
    the workload reports one, else core-seconds."""
    s = result.summary
    if isinstance(s.get("reserved_ratio"), int | float):
        return f"{s['reserved_ratio']:.2f}"
    tangram, base = result.run_of("tangram"), result.run_of(str(s.get("best_baseline", "")))
    if tangram is None or base is None or base.core_s_reserved <= 0:
        return "-"
    return f"{tangram.core_s_reserved / base.core_s_reserved:.2f}"


def _lost(result: WorkloadResult) -> str:
    per = result.summary.get("per_system", {})
    if result.name == "swe" and isinstance(per, dict):
        lost = {name: int(v.get("rewards_lost", 0)) for name, v in per.items() if v.get("rewards_lost")}
        return ", ".join(f"{n}: {k} rewards" for n, k in sorted(lost.items())) or "nothing"
    lost_actions = result.summary.get("actions_lost")
    return "nothing" if not lost_actions else f"{lost_actions} actions"


def sentence(result: WorkloadResult) -> str:
    s = result.summary
    act, step, base = s.get("act_gain"), s.get("step_gain"), s.get("best_baseline", "the baseline")
    if result.name == "mopd" and s.get("static_device_bytes"):
        mem = s["tangram_device_bytes"] / s["static_device_bytes"]
        p50 = s["tangram_p50_ms"] / s["static_p50_ms"] if s.get("static_p50_ms") else math.nan
        return f"mopd: ARL-Tangram serves the teachers in {mem:.2f} of the static deployment's device memory, at {p50:.2f} of its p50 latency."
    if not isinstance(act, int | float) or not isinstance(step, int | float):
        return f"{result.name}: no tangram-vs-baseline comparison in this run."
    figures = (("ACT", act), ("step time", step))
    wins = [f"{what} {g:.2f}x" for what, g in figures if g >= WIN]
    ties = [what for what, g in figures if g < WIN]
    said = f"{result.name}: against {base}, ARL-Tangram wins on {' and '.join(wins)}" if wins else f"{result.name}: ARL-Tangram does not beat {base}"
    if ties and wins:
        said += f"; it does not win on {' or '.join(ties)}"
    if result.name == "swe" and s.get("baseline_lost_no_reward") is False:
        said += " (every pod system lost reward: compared with the one that lost least)"
    return " ".join([said + ".", *_also(result)])


def _also(result: WorkloadResult) -> list[str]:
    """What the gains leave out, where the workload measured it: the resources reserved
    against the baseline's, the rewards or 429s the others lost, and the run's ACT ceiling
    (and, from ``coding_ceiling``, the bound for whole runs and a clairvoyant scheduler's
    replay) when the ACT gain falls short of it being a win."""
    s, out = result.summary, []
    base = s.get("best_baseline", "the baseline")
    ratio = s.get("reserved_ratio")
    if isinstance(ratio, int | float) and math.isfinite(ratio):
        out.append(f"It reserves {ratio:.2f} of {base}'s cores and memory.")
    per = s.get("per_system", {})
    lost = {n: int(v.get("rewards_lost", 0)) for n, v in per.items() if isinstance(v, dict) and v.get("rewards_lost")}
    if result.name == "swe" and lost:
        who = "ARL-Tangram lost none; " if "tangram" not in lost else ""
        out.append(who + ", ".join(f"{n} lost {k} rewards" for n, k in sorted(lost.items())) + ".")
    if isinstance(s.get("baseline_leaked_429"), int | float) and isinstance(s.get("leaked_429"), int | float):
        out.append(f"It leaked {int(s['leaked_429'])} provider 429s to trajectories, the baseline {int(s['baseline_leaked_429'])}.")
    skipped = s.get("not_run_systems")
    if isinstance(skipped, dict) and skipped:
        out.append("; ".join(f"{n} {why}" for n, why in skipped.items()) + ".")
    ceiling, act = s.get("act_gain_ceiling"), s.get("act_gain")
    if isinstance(ceiling, int | float) and isinstance(act, int | float) and act < WIN and math.isfinite(ceiling):
        out.append(f"On this run's cores no scheduler could beat {base}'s ACT by more than {ceiling:.2f}x.")
        whole, replay = s.get("act_gain_ceiling_whole_runs"), s.get("act_gain_srpt_replay")
        if isinstance(whole, int | float) and math.isfinite(whole):
            out.append(f"Running each action whole on cores of its own (as here), none could beat {whole:.2f}x on these arrivals.")
        if isinstance(replay, int | float) and math.isfinite(replay):
            out.append(f"Shortest-remaining-first knowing every run's length, on the same arrivals, would reach {replay:.2f}x.")
        out += _queue_line(s)
    return out


def _queue_line(s: dict[str, Any]) -> list[str]:
    """From ``coding_queue``: how much of the queue was tests behind tests (capacity) and
    lints behind tests (what letting short actions pass could take away, at most)."""
    share, lints = s.get("queue_anatomy", {}).get("env_queue_share"), s.get("act_gain_lints_never_behind_tests")
    if not isinstance(share, dict) or not isinstance(lints, int | float):
        return []
    return [f"Of its env queue time, {share.get('test_behind_tests', 0):.0%} was test runs waiting for the test runs holding every core and "
            f"{share.get('lint_behind_tests', 0):.0%} lints waiting behind tests; had no lint waited there it would reach at most {lints:.2f}x."]


def headline(results: Sequence[WorkloadResult]) -> str:
    lines = ["== in short ==", f"{'workload':<11} {'vs (best baseline)':<20} {'ACT gain':>9} {'step gain':>10} {'reserved':>9}  lost"]
    for r in results:
        s = r.summary
        lines.append(f"{r.name:<11} {str(s.get('best_baseline', '-')):<20} {_gain(s.get('act_gain')):>9} {_gain(s.get('step_gain')):>10}"
                     f" {_reserved(r):>9}  {_lost(r)}")  # fmt: skip
    lines += [sentence(r) for r in results]
    return "\n".join(lines)
