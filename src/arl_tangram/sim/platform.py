"""Sim: latency models of the platform under each policy (what the managers cost, not what they decide).

Every number cites shared/PAPER.md or is labelled an assumption; all are printed in the
report so a reader can change them and rerun.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Platform:
    name: str
    env_start_min_s: float  # sandbox / pod start, uniform in [min, max]
    env_start_max_s: float
    action_overhead_s: float  # per env action: AoE cgroup resize, or a control-plane exec round trip
    host_to_device_gbps: float  # GPU swap-in bandwidth per device
    api_rtt_s: float = 0.05  # a 429 answer's round trip (assumption)

    def env_start_s(self, rng: random.Random) -> float:
        return rng.uniform(self.env_start_min_s, self.env_start_max_s)

    def describe(self) -> dict[str, float | str]:
        return asdict(self)


# ARL-Tangram: pre-created sandboxes from a warm pool (creation measured by `bench cpu`
# is tens of ms; warm-pool hand-out is assumed 0.03 s); AoE overhead 0.024 s per action
# (PAPER: ACT breakdown, coding batch 1280); swap-in over PCIe 5 at 25 GB/s per device
# (assumption).
TANGRAM = Platform("arl-tangram", 0.0, 0.03, 0.024, 25.0)

# Kubernetes, nominal: pod start 2-5 s (PAPER: Docker 2-5 s), no exec overhead.
K8S = Platform("kubernetes", 2.0, 5.0, 0.0, 25.0)

# Kubernetes with control-plane costs at scale: sandbox start about 20 s on a loaded host
# (PAPER: SkyRL issue #9; modelled as uniform 10-30 s, assumption on the spread) and about
# 2.5 s per exec (PAPER: INTELLECT-3 report).
K8S_CONTROL_PLANE = Platform("kubernetes+control-plane", 10.0, 30.0, 2.5, 25.0)

# The physical lower bound: nothing costs anything.
IDEAL = Platform("ideal", 0.0, 0.0, 0.0, float("inf"))
