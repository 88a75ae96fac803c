"""Shell: the nodes' memory reports (issue 21, memory pressure): each housekeeping sweep
measures every local node's free memory for sandboxes (``managers.cpu.node_memory``) and
posts ``NodeMemoryPressure`` when it moved by ``REPORT_STEP_BYTES`` or more, or the PSI
stall share changed, so an idle node costs no scheduling rounds.

Only agents whose CPU manager is local (it has a cgroup ``driver``) are measured; a remote
node reports through its own backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from arl_tangram.agent.node import NodeAgent
from arl_tangram.core.events import Event, NodeMemoryPressure
from arl_tangram.managers.cpu import node_memory
from arl_tangram.runtime.loop import ControllerLoop


class ReportHost(Protocol):
    """What memory reports need of the controller (``Controller`` is one)."""

    @property
    def loop(self) -> ControllerLoop: ...

    @property
    def node_agents(self) -> Sequence[NodeAgent]: ...

    def post(self, event: Event) -> str: ...

#: the least change of a node's measured free memory that is reported again (assumption:
#: 4 MiB is under the smallest grant a learned peak gives and above page-cache jitter)
REPORT_STEP_BYTES = 4 << 20


class MemoryReporter:
    """Called by the housekeeper (one task): not thread-safe, no state beyond the last report."""

    def __init__(self, controller: ReportHost) -> None:
        self.controller = controller
        self._last: dict[str, node_memory.NodeMemory] = {}

    async def poll(self) -> None:
        nodes = {n.node_id: n.mem_bytes for n in self.controller.loop.state.spec.cpu_nodes}
        for agent in self.controller.node_agents:
            driver = getattr(agent.cpu, "driver", None)
            node_id = agent.cpu_node_id
            if driver is None or node_id not in nodes:
                continue
            seen = await asyncio.to_thread(node_memory.measure, driver.memory_dirs(), nodes[node_id])
            last = self._last.get(node_id)
            if last is not None and abs(seen.free_bytes - last.free_bytes) < REPORT_STEP_BYTES and seen.some_avg10 == last.some_avg10:
                continue
            self._last[node_id] = seen
            self.controller.post(NodeMemoryPressure(node_id, seen.free_bytes, seen.some_avg10))
