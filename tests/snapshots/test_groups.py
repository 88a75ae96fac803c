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
