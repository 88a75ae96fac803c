"""Shell: verl's ``ToolAgentLoop`` that tells ARL-Tangram's tools which GRPO group their
trajectory belongs to (optional extra: needs ``verl``). Select it with the rollout's
``agent_name: tangram_tool_agent`` (importing this module registers it).

verl keeps the group's id as ``uid`` in the batch's non-tensor data; the agent loop's
``run(**kwargs)`` receives it but its ``AgentData`` (what tools see) does not. This loop puts
it in ``integrations.verl.GROUP_UID`` for the trajectory's task, so ``TangramCodeTool`` with
``group: true`` can fork a group's envs from its first trajectory's set-up env.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from arl_tangram.integrations.verl import GROUP_UID


@register("tangram_tool_agent")
class TangramToolAgentLoop(ToolAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        token = GROUP_UID.set(str(kwargs.get("uid", "") or ""))
        try:
            return await super().run(sampling_params, priority, **kwargs)
        finally:
            GROUP_UID.reset(token)
