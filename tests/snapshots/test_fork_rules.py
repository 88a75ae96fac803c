"""The rules of snapshot, fork and rollback through the SDK: a fork waits for the parent's
running action (an env is never snapshotted mid-write), and every refusal names its field:
a released env, a ``count`` out of bounds or whose children can never fit on the node, a
host-root env, an open session, another
tenant's snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from arl_tangram.client import AsyncClient, SpecError
from tests.images.kit import ImageKit
from tests.snapshots.test_fork_sdk import delete_when_free

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
Connector = Callable[..., Any]


async def test_a_fork_waits_for_the_running_action(connector: Connector, image_kit: ImageKit) -> None:
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        parent = await tg.create_env(image=image_kit.reference, memory="128MiB")
        writer = asyncio.create_task(parent.exec("sleep 0.6; echo -n done > /testbed/late"))
        await asyncio.sleep(0.2)  # the writer runs (its env is busy) when the fork is asked
        [child] = await parent.fork(1)
        assert (await writer).ok  # not killed by the snapshot's restart
        assert (await child.read_file("/testbed/late")) == b"done"  # frozen after the write, not mid-way
        snap = (await tg.list_snapshots())[-1]
        assert snap.env_id == parent.env_id
        await child.release()
        await parent.release()
        await delete_when_free(tg, snap)


async def test_refusals_name_their_field(connector: Connector, image_kit: ImageKit) -> None:
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        env = await tg.create_env(image=image_kit.reference, memory="128MiB")
        for count in (0, 65):  # max_fork_count is 64 by default
            with pytest.raises(SpecError) as bad:
                await env.fork(count)
            assert bad.value.field == "count"
        big = await tg.create_env(image=image_kit.reference, memory="4GiB")  # 64 of it: more than any node here
        with pytest.raises(SpecError) as never_fits:
            await big.fork(64)
        assert never_fits.value.field == "count" and "never fit" in never_fits.value.rule
        await big.release()
        host = await tg.create_env(memory="128MiB")
        with pytest.raises(SpecError) as on_host:
            await host.snapshot()
        assert on_host.value.field == "snapshot"
        session = await env.session()
        with pytest.raises(SpecError) as open_session:
            await env.fork(2)
        assert open_session.value.field == "snapshot" and "session" in open_session.value.rule
        await session.close()
        snap = await env.snapshot()
        if isinstance(tg, AsyncClient) and hasattr(tg.transport, "controller"):  # another tenant: not found
            stranger = AsyncClient(tg.transport, tenant="someone-else")
            with pytest.raises(SpecError) as foreign:
                await stranger.get_snapshot(snap)
            assert foreign.value.field == "snapshot_id"
        await host.release()
        await env.release()
        with pytest.raises(SpecError) as gone:
            await env.fork(1)
        assert gone.value.field == "env_id"
        await delete_when_free(tg, snap)
