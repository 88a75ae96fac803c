"""Core: memory pressure on a node (issue 21): what the node really has free against what
the ledger believes, and when admission closes (pure accounting, no I/O).

The node reports its memory as events (``NodeMemoryPressure``): the bytes really
available to sandboxes (its budget less their usage, reclaimable page cache counted as
free) and the PSI stall share (``some avg10``, percent) where the kernel has one. The ledger
already never admits beyond the node's memory less the reserve; a report can only make it
stricter:

  * ``shortfall`` = what the ledger believes free less what the node measured free, when
    positive (memory used outside the accounting: a leak, other processes, page cache that
    will not reclaim). It is subtracted from every admission until the next report, so what
    the core admits after a report never exceeds the measured free memory less the reserve
    (plus what finishing actions give back, which the kernel also gets back).
  * A PSI stall share at or above ``STALL_PCT`` closes admission on the node outright (the
    kernel is already reclaiming hard): the shortfall becomes all the ledger's free memory.

Which actions wait, under pressure (free less shortfall below the reserve): every new
admission on the node waits, in its usual order: envs in request order (FCFS), queued
actions that need a memory grant in queue order with aging, paused actions in their FCFS
line (none grows). Running actions keep their grants and run on; actions with no memory
grant (their env holds its limit) still start. When every action holding memory on the node
is paused, the deadlock rule of ``core.memory`` ends the youngest. A report showing enough
free memory again (or a node's loss) clears the shortfall and admission resumes.
"""

from __future__ import annotations

from arl_tangram.core.state import StateEditor

#: PSI ``some avg10`` (percent of the last 10 s in which some task stalled on memory) at
#: which a node admits nothing. Assumption: 10 % is well past the ~0 an unpressured node
#: shows and below the stalls a thrashing one shows (tens of percent).
STALL_PCT = 10.0


def on_report(ed: StateEditor, node_id: str, free_bytes: int, some_avg10: float | None) -> None:
    """Record a node's memory report (``NodeMemoryPressure``); unknown nodes are ignored."""
    free = ed.cpu.get(node_id)
    if free is None:
        return
    believed = max(0, free.free_mem_bytes)
    shortfall = max(0, believed - max(0, free_bytes))
    if some_avg10 is not None and some_avg10 >= STALL_PCT:
        shortfall = believed
    table = ed.mem_shortfall
    if shortfall != table.get(node_id, 0):
        if shortfall:
            ed.w("mem_shortfall")[node_id] = shortfall
        else:
            del ed.w("mem_shortfall")[node_id]
    ed.touch(node_id)


def shortfall_bytes(ed: StateEditor, node_id: str) -> int:
    """Bytes of the ledger's free memory on the node that the last report says are not free."""
    return ed.mem_shortfall.get(node_id, 0)


def forget_node(ed: StateEditor, node_id: str) -> None:
    if node_id in ed.mem_shortfall:
        del ed.w("mem_shortfall")[node_id]


def under_pressure(ed: StateEditor, node_id: str, reserve_bytes: int) -> bool:
    """Whether the node's admission is closed: its free memory, less the shortfall, is
    under the reserve."""
    return ed.cpu[node_id].free_mem_bytes - shortfall_bytes(ed, node_id) < reserve_bytes


__all__ = ["STALL_PCT", "forget_node", "on_report", "shortfall_bytes", "under_pressure"]
