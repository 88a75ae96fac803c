"""Shell: ``arl-tangram bench scheduler``: time per scheduling round on the paper's cluster.

The cluster (15 CPU nodes × 256 cores, PAPER) is kept busy: one running action per env
until the cores are taken, and ``queued`` more actions waiting. Each measured round is what
the live controller sees most: one action finishes and its trajectory submits the next.
The mix (40% elastic test runs up to 32 cores, 60% one-core commands) follows the coding
workload of the simulator.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Any

from arl_tangram.core.action import ActionSpec, Binding, EnvSpec
from arl_tangram.core.elasticity import Amdahl
from arl_tangram.core.events import ActionFinished, ActionSubmitted, EnvReady, EnvRequested, Event
from arl_tangram.core.policies.registry import make_policy
from arl_tangram.core.resources import MILLICORES_PER_CORE, ResourceKind, ResourceVector
from arl_tangram.core.scheduler import Scheduler
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import uniform_cluster

CORE = ResourceVector(cpu_millicores=MILLICORES_PER_CORE)


def _action(rng: random.Random, n: int, env_id: str) -> ActionSpec:
    if rng.random() < 0.4:
        return ActionSpec(f"a{n}", "test", Binding("env", env_id), demand_per_unit=CORE, key=ResourceKind.CPU,
                          dop_min=1, dop_max=32, elasticity=Amdahl(0.04), t_ori_s=rng.uniform(2.0, 20.0))
    return ActionSpec(f"a{n}", "command", Binding("env", env_id), demand_fixed=CORE, t_ori_s=rng.uniform(0.2, 1.0))


def measure(queued: int, rounds: int, policy: str, seed: int = 0) -> dict[str, Any]:
    """p50/p99 of ``Scheduler.step`` wall time with about ``queued`` actions waiting."""
    rng = random.Random(seed)
    sched = Scheduler(make_policy(policy))
    state = ClusterState.initial(uniform_cluster(num_cpu_nodes=15))
    num_envs = max(queued, 1) + 4000
    envs = [f"e{i}" for i in range(num_envs)]
    state = sched.step(state, [EnvRequested(EnvSpec(e, 1 << 30)) for e in envs], 0.0).state
    state = sched.step(state, [EnvReady(e) for e in envs], 0.0).state
    counter = 0
    now = 0.0

    def submit(n: int) -> ClusterState:
        nonlocal counter
        batch = [ActionSubmitted(_action(rng, counter + i, envs[(counter + i) % num_envs])) for i in range(n)]
        counter += n
        return sched.step(state, batch, now).state

    # Saturate the cores first, then add the waiting actions the round must look past.
    while sum(f.free_millicores for f in state.cpu.values()) > 0.02 * 15 * 256 * MILLICORES_PER_CORE:
        if len(state.queue_cpu) >= queued:
            break
        state = submit(20)
    while len(state.queue_cpu) < queued:
        state = submit(max(20, queued - len(state.queue_cpu)))
    durations = []
    for _ in range(rounds):
        now += 0.01
        victim = min(state.running.values(), key=lambda r: (r.expected_end_s, r.spec.action_id))
        env_id = victim.spec.binding.name
        # One finish and its trajectory's next action, plus arrivals that keep the queue
        # at its target depth (a finish of a wide action lets many queued ones start).
        refill = max(0, queued - len(state.queue_cpu))
        events: list[Event] = [ActionFinished(victim.spec.action_id, "succeeded", 1.0)]
        events += [ActionSubmitted(_action(rng, counter + i, env_id if i == 0 else envs[(counter + i) % num_envs])) for i in range(1 + refill)]
        counter += 1 + refill
        t0 = time.perf_counter()
        state = sched.step(state, events, now).state
        durations.append((time.perf_counter() - t0) * 1000.0)
    durations.sort()
    return {
        "queued": len(state.queue_cpu),
        "queued_target": queued,
        "running": len(state.running),
        "rounds": rounds,
        "p50_ms": statistics.median(durations),
        "p99_ms": durations[min(len(durations) - 1, int(0.99 * len(durations)))],
        "max_ms": durations[-1],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="arl-tangram bench scheduler", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--policy", default="elastic")
    parser.add_argument("--queued", type=int, nargs="*", default=[100, 1000, 10000])
    args = parser.parse_args(argv)
    rows = []
    for q in args.queued:
        print(f"bench scheduler: {q} queued, {args.rounds} rounds ...", file=sys.stderr)
        rows.append(measure(q, args.rounds, args.policy))
    targets = {"1000": 5.0, "10000": 50.0}
    result = {"policy": args.policy, "rounds": rows,
              "targets": {f"p99_ms@{k}": {"target": f"<= {v}", "value": next((r["p99_ms"] for r in rows if r["queued_target"] == int(k)), None)} for k, v in targets.items()}}
    for t in result["targets"].values():
        t["met"] = t["value"] is not None and t["value"] <= float(t["target"].split()[-1])
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{'queued':>8} {'running':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in rows:
        print(f"{r['queued']:>8} {r['running']:>8} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms']:>8.3f}")
    for name, t in result["targets"].items():
        print(f"{name}: {t['value']} target {t['target']}: {'met' if t['met'] else 'MISSED'}")
    return 0
