"""Core: placing pending envs on CPU nodes (shared by the action-level policies).

Image locality: an env on an image goes to a node where its layers are soonest ready
(``images.ready_in_s``: zero where they are, the rest of an in-flight pull, else missing
bytes over the node's bandwidth); nodes within ``PULL_SLACK_S`` of the best count as equal
and are spread over as host-root envs are, so a small pull does not pile envs on one node.
"""

from __future__ import annotations

from dataclasses import replace

from arl_tangram.core import images, memory
from arl_tangram.core.decisions import Decision
from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import StateEditor

PULL_SLACK_S = 0.5  # a pull this much longer than the best node's is worth the spread


def pending_envs(ed: StateEditor) -> list[str]:
    """Env ids waiting for placement, in request (FCFS) order."""
    return sorted(ed.env_queue, key=lambda env_id: ed.env_queue[env_id])


def place_spread(
    ed: StateEditor, cause: str, cores_held: int = 0, *, per_action_memory: bool = False, mem_reserve_bytes: int = 0
) -> list[Decision]:
    """Place every pending env on the node with the most free memory that holds it.

    Spreading balances the envs, and so the future actions bound to them, over nodes.
    ``cores_held`` (millicores) is reserved for the env's whole life; zero under
    Allocate-on-Execution, where an idle env holds memory only: its limit, or with
    ``per_action_memory`` its footprint (``core.memory``), admitted only beside
    ``mem_reserve_bytes`` and what paused actions wait for.
    """
    decisions: list[Decision] = []
    for env_id in pending_envs(ed):
        env = ed.envs[env_id]
        mem = memory.footprint_prior(env.spec) if per_action_memory else env.spec.mem_bytes
        held = ResourceVector(cpu_millicores=cores_held, mem_bytes=mem)
        fits = [
            n for n in sorted(ed.cpu)
            if memory.admissible_bytes(ed, n, mem_reserve_bytes) >= held.mem_bytes and ed.cpu[n].free_millicores >= cores_held
        ]  # fmt: skip
        if env.spec.fork_of:  # a fork's child: on its parent's node, where the snapshot is
            parent = ed.envs.get(env.spec.fork_of)
            if parent is not None and parent.node_id is not None:  # gone: its node's create fails, naming the snapshot
                fits = [n for n in fits if n == parent.node_id]
        if not fits:
            break  # FCFS: later envs wait behind the first that does not fit
        reason = "spread: most free capacity"
        if env.spec.on_image:
            wait = {n: images.ready_in_s(ed, n, env.spec) for n in fits}
            soonest = min(wait.values())
            fits = [n for n in fits if wait[n] <= soonest + PULL_SLACK_S]
            reason = f"image locality: layers ready in ~{soonest:.2f} s, then {reason}"
        best = fits[0]  # ties go to the first node id in sorted order
        for node_id in fits[1:]:
            if _spread_key(ed, node_id, cores_held) > _spread_key(ed, best, cores_held):
                best = node_id
        if per_action_memory:
            ed.w("envs")[env_id] = replace(env, per_action_memory=True)
        decisions += images.assign_env(ed, env_id, best, held, reason, cause)
    return decisions


def _spread_key(ed: StateEditor, node_id: str, cores_held: int) -> tuple[int, int]:
    free = ed.cpu[node_id]
    return (free.free_millicores if cores_held else 0, free.free_mem_bytes)
