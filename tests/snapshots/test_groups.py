"""The mini-swe-agent environment's ``group`` option on a real server: the group's first
environment runs the task's setup once, the others start from its snapshot (same files,
setup not repeated) and stay private from each other."""

from __future__ import annotations

import pytest

from arl_tangram.integrations.minisweagent import TangramEnvironment
from tests.client.conftest import serving
from tests.images.kit import ImageKit

pytestmark = pytest.mark.usefixtures("sandbox_host")
SETUP = "echo -n built > /testbed/built && python3 -c 'import os; print(os.urandom(8).hex())' > /testbed/nonce"


def test_group_members_after_the_first_fork_from_its_setup(image_kit: ImageKit) -> None:
    with serving(image_kit.config(image_kit.shared_store)) as server:
        options = {"url": server.url, "image": image_kit.reference, "memory": "128MiB", "group": "task-7", "setup": SETUP}
        members = [TangramEnvironment(**options) for _ in range(3)]
        try:
            nonces = {m.execute("cat /testbed/built /testbed/nonce")["output"] for m in members}
            assert len(nonces) == 1 and next(iter(nonces)).startswith("built")  # one setup, seen by all
            members[1].execute("echo mine > /testbed/built")
            assert members[2].execute("cat /testbed/built")["output"].startswith("built")  # private writes
        finally:
            for m in members:
                m.close()


@pytest.mark.anyio
async def test_verl_group_trajectories_start_from_the_first_ones_setup(image_kit: ImageKit) -> None:
    pytest.importorskip("verl", reason="verl is not installed")
    from arl_tangram.integrations.verl import GROUP_UID, TangramCodeTool
    from tests.integrations.test_verl_adapters import call_tool

    with serving(image_kit.config(image_kit.shared_store)) as server:
        tool = TangramCodeTool({"tangram_url": server.url, "image": image_kit.reference, "group": True, "setup": SETUP,
                                "memory_limit_mb": 128})  # fmt: skip
        read = {"code": "print(open('/testbed/built').read(), open('/testbed/nonce').read())"}
        token = GROUP_UID.set("uid-of-prompt-3")  # what verl_group_loop sets from the batch's uid
        try:
            outs = {await call_tool(tool, read, f"traj-{i}") for i in range(3)}
            assert len(outs) == 1 and next(iter(outs)).startswith("built")  # one setup for the group
        finally:
            GROUP_UID.reset(token)
            await tool.aclose()
