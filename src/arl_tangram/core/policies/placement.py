"""Core: placing pending envs on CPU nodes (shared by the action-level policies)."""

from __future__ import annotations

from arl_tangram.core import ledger
from arl_tangram.core.decisions import Decision
from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import StateEditor


def pending_envs(ed: StateEditor) -> list[str]:
    """Env ids waiting for placement, in request (FCFS) order."""
    return sorted(ed.env_queue, key=lambda env_id: ed.env_queue[env_id])


def place_spread(ed: StateEditor, cause: str, cores_held: int = 0) -> list[Decision]:
    """Place every pending env on the node with the most free memory that holds it.

    Spreading balances the envs, and so the future actions bound to them, over nodes.
    ``cores_held`` (millicores) is reserved for the env's whole life; zero under
    Allocate-on-Execution, where an idle env holds memory only.
    """
    decisions: list[Decision] = []
    for env_id in pending_envs(ed):
        env = ed.envs[env_id]
        held = ResourceVector(cpu_millicores=cores_held, mem_bytes=env.spec.mem_bytes)
        best = None
        for node_id in sorted(ed.cpu):
            free = ed.cpu[node_id]
            if free.free_mem_bytes >= held.mem_bytes and free.free_millicores >= cores_held:
                key = (free.free_millicores if cores_held else 0, free.free_mem_bytes)
                if best is None or key > best[0]:
                    best = (key, node_id)
        if best is None:
            break  # FCFS: later envs wait behind the first that does not fit
        decisions.append(ledger.place_env(ed, env_id, best[1], held, "spread: most free capacity", cause))
    return decisions
