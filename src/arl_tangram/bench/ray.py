"""Bench: the Ray backend on a local multi-node Ray cluster (``arl-tangram bench ray``).

The cluster (``ray.cluster_utils.Cluster``, every node a raylet of its own on this host,
loopback only, Ray's temp dir inside a temp dir removed at the end): two sandbox nodes and
one model node (all-MiniLM-L6-v2 on a CPU device). One controller in this process drives
them through the Ray backend; an embedded runtime (the local backend) runs beside it.

- ``dispatch_overhead_p50_ms``: ``true`` in a sandbox, one at a time, alternately on the
  local backend and on a Ray node; an action's overhead is its ACT less its queueing and the
  execution its manager measured. The figure is p50(Ray) - p50(local): what dispatching
  through an agent actor adds (``*_overhead_p50_ms`` give both).
- A rollout: ``trajectories`` trajectories, each an env and a loop of ``sleep`` actions with
  a reward-model call every other step. Mid-run one sandbox node is killed (SIGKILL of all
  its processes): its trajectories' actions end ``error`` (``node_lost``) and those
  trajectories stop; ``node_loss_detect_s`` is from the kill to the controller being told.
  Then a fresh node is added; ``node_join_first_action_s`` is from starting it to the first
  action succeeding on it (Ray's node start included), new trajectories having started
  once it joined. ``actions_ok + actions_lost_reported`` must equal ``actions_submitted``
  (``actions_other`` counts anything else).
- Large outputs: one exec printing 10 MiB, run twice on a sandbox node: with outputs by
  value (the agent returns them in the result), then by reference (the agent keeps them in
  its object store). ``output_10mib_record_bytes_*`` is the size of the result the
  controller receives and keeps (its journal form, JSON); ``output_10mib_read_ms_*`` the
  time from submission to the caller holding all 10 MiB (fetched on read when by reference).
- A false loss: a sandbox node's agent is paused (SIGSTOP) past the loss timeout, then
  resumed; ``node_rejoin_s`` is from the resume to the node joining again (its agent reset).

Prints one flat JSON object with ``--json``; figures are whatever was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from arl_tangram.client.client import AsyncClient
from arl_tangram.client.transport import InProcessTransport
from arl_tangram.runtime.actions import ActionResult, ExecPayload, read_result
from arl_tangram.runtime.codec import result_to_dict
from arl_tangram.runtime.config import GpuConfig, ServiceConfig, TangramConfig
from arl_tangram.runtime.embedded import EmbeddedRuntime
from arl_tangram.runtime.ray import controller_factory

SANDBOX = {"arl_tangram": 1.0}
MODEL = {"arl_tangram_gpu": 1.0}
REWARD = "reward/minilm"
TARGETS = {"dispatch_overhead_p50_ms": 3.0, "node_loss_detect_s": 5.0}


@dataclass
class Tally:
    submitted: int = 0
    ok: int = 0
    lost: int = 0
    other: list[str] = field(default_factory=list)
    first_ok_on: dict[str, float] = field(default_factory=dict)  # agent id -> wall time

    def count(self, r: ActionResult) -> bool:
        """Count one result; False when the trajectory must stop (its node was lost)."""
        self.submitted += 1
        if r.outcome == "succeeded":
            self.ok += 1
            agent = (r.node_id or "").split("/")[0]
            self.first_ok_on.setdefault(agent, time.time())
            return True
        if r.outcome == "error" and "node_lost" in (r.cause or ""):
            self.lost += 1
            return False
        self.other.append(f"{r.outcome}: {r.cause}")
        return False


async def _trajectory(tg: AsyncClient, tally: Tally, steps: int, step_s: float) -> None:
    try:
        env = await tg.create_env(memory="256MiB")
    except Exception as exc:  # placed on the node being lost: not an action, not counted
        if "node_lost" not in str(exc):
            tally.other.append(f"env: {exc}")
        return
    try:
        for step in range(steps):
            if not tally.count(await env.exec(f"sleep {step_s}", cpu=1, timeout_s=30.0)):
                return
            if step % 2 and not tally.count(
                await tg.call(REWARD, {"a": f"answer {step}", "b": "reference"})
            ):
                return
    finally:
        await env.release()


async def _overhead(local: AsyncClient, remote: AsyncClient, samples: int) -> dict[str, float]:
    envs = [await local.create_env(memory="256MiB"), await remote.create_env(memory="256MiB")]
    lat: tuple[list[float], list[float]] = ([], [])
    for i in range(samples + 3):
        for side, env in enumerate(envs):
            r = await env.exec("true", cpu=1)
            if r.outcome != "succeeded":
                raise RuntimeError(f"overhead probe failed: {r.outcome} {r.cause}")
            if i >= 3:  # warm-up: first launches, first thread hops
                lat[side].append(r.overhead_s * 1000.0)
    for env in envs:
        await env.release()
    local_p50, ray_p50 = statistics.median(lat[0]), statistics.median(lat[1])
    return {
        "local_overhead_p50_ms": round(local_p50, 3),
        "ray_overhead_p50_ms": round(ray_p50, 3),
        "dispatch_overhead_p50_ms": round(ray_p50 - local_p50, 3),
    }


async def _rollout(
    cluster: Any, victim: Any, rt: Any, tg: AsyncClient, quick: bool
) -> dict[str, Any]:
    """The rollout with a node killed mid-run and a node added; see the module docstring."""
    from arl_tangram.backends.ray.local_cluster import LocalRayCluster

    tally, events = Tally(), dict[str, tuple[str, float]]()
    rt.membership.on_lost.append(lambda agent, t: events.setdefault("lost", (agent.node_id, t)))
    rt.membership.on_join.append(lambda agent, t: events.setdefault("joined", (agent.node_id, t)))
    steps, step_s, num = (10, 0.4, 4) if quick else (16, 0.4, 8)
    victim_agent = f"ray-{LocalRayCluster.node_id(victim)[:8]}"
    async with asyncio.TaskGroup() as group:
        for _ in range(num):
            group.create_task(_trajectory(tg, tally, steps, step_s))
        await asyncio.sleep(2.0)
        envs = rt.controller.loop.state.envs.values()
        envs_lost = sum(1 for e in envs if (e.node_id or "").startswith(f"{victim_agent}/"))
        killed = time.time()
        await asyncio.to_thread(cluster.remove_node, victim)
        while "lost" not in events and time.time() - killed < 30:
            await asyncio.sleep(0.05)
        added = time.time()
        node = await asyncio.to_thread(cluster.add_node, SANDBOX)
        new_agent = f"ray-{LocalRayCluster.node_id(node)[:8]}"
        while "joined" not in events and time.time() - added < 60:
            await asyncio.sleep(0.05)
        for _ in range(2):
            group.create_task(_trajectory(tg, tally, steps, step_s))
    lost_at = events.get("lost", ("", float("nan")))[1]
    joined_at = events.get("joined", ("", float("nan")))[1]
    return {
        "actions_submitted": tally.submitted,
        "actions_ok": tally.ok,
        "actions_lost_reported": tally.lost,
        "actions_other": len(tally.other),
        "other_examples": tally.other[:3],
        "envs_lost": envs_lost,
        "node_loss_detect_s": round(lost_at - killed, 3),
        "node_join_agent_s": round(joined_at - added, 3),
        "node_join_first_action_s": round(
            tally.first_ok_on.get(new_agent, float("nan")) - added, 3
        ),
    }


async def _large_output(rt: Any, tg: AsyncClient) -> dict[str, Any]:
    """A 10 MiB stdout by value, then by reference: what the controller holds of it."""
    ten_mib = 10 << 20
    env = await tg.create_env(memory="256MiB")
    node = rt.controller.loop.state.envs[env.env_id].node_id.split("/")[0]
    (link,) = (link for link in rt.membership.links.values() if link.agent_id == node)
    by_reference = link.hold_min_bytes
    out: dict[str, Any] = {}
    for mode, hold in (("by_value", None), ("by_reference", by_reference)):
        link.hold_min_bytes = hold
        spec = env._spec("exec", 1, 60.0, None)
        started = time.monotonic()
        record = rt.controller.submit(
            spec, ExecPayload(f"head -c {ten_mib} /dev/zero | tr '\\0' x")
        )
        read = await read_result(record)
        read_ms = (time.monotonic() - started) * 1000.0
        if read.outcome != "succeeded" or len(read.stdout) != ten_mib:
            raise RuntimeError(
                f"large output probe: {read.outcome} {read.cause} {len(read.stdout)} bytes"
            )
        out[f"output_10mib_record_bytes_{mode}"] = len(json.dumps(result_to_dict(record.result)))
        out[f"output_10mib_read_ms_{mode}"] = round(read_ms, 1)
        rt.controller.ack(spec.action_id)
    link.hold_min_bytes = by_reference
    await env.release()
    return out


async def _false_loss(rt: Any) -> dict[str, Any]:
    """Pause a sandbox node's agent past the loss timeout, resume it, time its rejoin."""
    (nid, link) = next(
        (n, link) for n, link in sorted(rt.membership.links.items())
        if not link.lost.is_set() and link.report.numa_cores is not None
    )  # fmt: skip
    seen: dict[str, float] = {}
    rt.membership.on_lost.append(
        lambda a, t: seen.setdefault("lost", t) if a.node_id == link.agent_id else None
    )
    rt.membership.on_join.append(
        lambda a, t: seen.setdefault("join", t) if a.node_id == link.agent_id else None
    )
    os.kill(link.report.pid, signal.SIGSTOP)
    try:
        deadline = time.time() + 30
        while "lost" not in seen and time.time() < deadline:
            await asyncio.sleep(0.05)
    finally:
        os.kill(link.report.pid, signal.SIGCONT)
    resumed = time.time()
    while "join" not in seen and time.time() - resumed < 60:
        await asyncio.sleep(0.05)
    back = rt.membership.links[nid] is not link and not rt.membership.links[nid].lost.is_set()
    return {
        "node_rejoined": back,
        "node_rejoin_s": round(seen.get("join", float("nan")) - resumed, 3),
    }


async def measure(quick: bool) -> dict[str, Any]:
    from arl_tangram.backends.ray.actor import GpuSettings
    from arl_tangram.backends.ray.local_cluster import LocalRayCluster
    from arl_tangram.backends.ray.membership import RaySettings
    from arl_tangram.backends.ray.runtime import start_ray_runtime
    from arl_tangram.managers.gpu.models import minilm_path

    service = ServiceConfig(REWARD, "score", folder=str(minilm_path()))
    config = TangramConfig(
        gpu=GpuConfig(devices=1, device_mem_bytes=512 << 20), services=(service,)
    )
    cluster = LocalRayCluster()
    try:
        cluster.start(SANDBOX)
        victim = await asyncio.to_thread(cluster.add_node, SANDBOX)
        await asyncio.to_thread(cluster.add_node, MODEL)
        local = AsyncClient(InProcessTransport(await EmbeddedRuntime.start(TangramConfig())))
        gpu = GpuSettings(config.gpu.devices, config.gpu.device_mem_bytes, config.gpu.mem_fraction)
        settings = RaySettings(gpu=gpu, max_output_bytes=16 << 20)  # room for the 10 MiB probe
        rt = await start_ray_runtime(
            config, cluster.address, make_controller=controller_factory(config), settings=settings
        )
        remote = AsyncClient(InProcessTransport(cast(EmbeddedRuntime, rt)))
        try:
            result: dict[str, Any] = {"nodes": len(rt.membership.live_agents)}
            result.update(await _overhead(local, remote, 20 if quick else 60))
            result.update(await _rollout(cluster, victim, rt, remote, quick))
            result.update(await _large_output(rt, remote))
            result.update(await _false_loss(rt))
        finally:
            lost = [
                link.report.cgroup_root
                for link in rt.membership.links.values()
                if link.lost.is_set()
            ]
            await local.aclose()
            await remote.aclose()
    finally:
        await asyncio.to_thread(cluster.close)
    result["cgroups_left"] = await _keeper_swept([r for r in lost if r])
    result["targets_met"] = (
        result["dispatch_overhead_p50_ms"] <= TARGETS["dispatch_overhead_p50_ms"]
        and result["node_loss_detect_s"] <= TARGETS["node_loss_detect_s"]
        and result["actions_ok"] + result["actions_lost_reported"] == result["actions_submitted"]
    )  # fmt: skip
    return result


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Ray's driver prints its nodes' errors (a killed raylet's last log lines) on stdout,
    and its processes inherit it: send file descriptor 1 to stderr while the cluster lives,
    so ``--json`` prints one clean line."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


async def _keeper_swept(roots: list[str], timeout_s: float = 10.0) -> list[str]:
    """The cgroups the killed node's agent left once its keeper had ``timeout_s`` to sweep
    them (reported), then removed so the host stays clean."""
    from arl_tangram.backends.ray.local_cluster import cgroup_dirs, remove_cgroup_leftovers

    deadline = time.monotonic() + timeout_s
    while cgroup_dirs(roots) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    left = cgroup_dirs(roots)
    remove_cgroup_leftovers(roots)
    return left


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="arl-tangram bench ray", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="small sample sizes (tests)")
    args = parser.parse_args(argv)
    print("bench ray: starting a local 3-node Ray cluster (about a minute)...", file=sys.stderr)
    with _stdout_to_stderr():
        result = asyncio.run(measure(args.quick))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
