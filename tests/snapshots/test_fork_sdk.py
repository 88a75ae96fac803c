"""Snapshot, fork and rollback through the SDK on a real image env (registry -> store ->
overlay sandbox): children see the parent's files as they were, writes stay private, a
rollback restores, and the refusals name their field. Nothing is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from arl_tangram.client import SpecError
from tests.images.kit import CALC, FIXED, ImageKit

pytestmark = [pytest.mark.usefixtures("sandbox_host"), pytest.mark.anyio]
Connector = Callable[..., Any]


async def delete_when_free(tg: Any, snap: Any, within_s: float = 10.0) -> None:
    """Delete ``snap`` once the envs released on it are gone (a release is asynchronous)."""
    for _ in range(int(within_s / 0.05)):
        try:
            return await tg.delete_snapshot(snap)
        except SpecError as exc:
            if "in use" not in exc.rule:
                raise
            await asyncio.sleep(0.05)
    await tg.delete_snapshot(snap)


async def test_fork_children_start_as_the_parent_and_stay_private(connector: Connector, image_kit: ImageKit) -> None:
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        parent = await tg.create_env(image=image_kit.reference, memory="128MiB")
        await parent.write_file("/testbed/calc.py", FIXED)
        assert (await parent.exec("echo w > /workspace/w && echo t > /tmp/t && rm /etc/hostname")).ok
        kids = await parent.fork(3)
        for kid in kids:  # the parent's state at the fork: root, /workspace, /tmp, a deletion
            r = await kid.exec("cat /testbed/calc.py /workspace/w /tmp/t; test -e /etc/hostname || echo gone; pwd")
            assert r.ok, r.stderr
            assert r.stdout == FIXED + "w\nt\ngone\n/testbed\n"
        await kids[0].write_file("/testbed/calc.py", CALC)
        assert (await kids[1].read_file("/testbed/calc.py")) == FIXED.encode()  # siblings: private
        assert (await parent.read_file("/testbed/calc.py")) == FIXED.encode()
        await parent.exec("echo later > /testbed/later")
        assert not (await kids[2].exec("test -e /testbed/later")).ok  # the parent's later writes too
        for kid in kids:
            await kid.release()
        await parent.release()
        for snap in await tg.list_snapshots():
            await delete_when_free(tg, snap)


async def test_rollback_restores_a_snapshot_and_refuses_strangers(connector: Connector, image_kit: ImageKit) -> None:
    async with connector(image_kit.config(image_kit.shared_store)) as tg:
        env = await tg.create_env(image=image_kit.reference, memory="128MiB")
        await env.write_file("/testbed/a", "1")
        snap = await env.snapshot("one")
        assert snap.name == "one" and snap.env_id == env.env_id and snap.depth == 1
        await env.write_file("/testbed/a", "2")
        assert (await env.exec("rm /testbed/calc.py")).ok
        await env.rollback(snap)
        assert (await env.read_file("/testbed/a")) == b"1" and (await env.read_file("/testbed/calc.py")) == CALC.encode()
        other = await tg.create_env(image=image_kit.reference, memory="128MiB")
        with pytest.raises(SpecError) as refused:  # other does not descend from snap
            await other.rollback(snap)
        assert refused.value.field == "snapshot_id"
        with pytest.raises(SpecError) as pinned:  # env stands on it
            await tg.delete_snapshot(snap)
        assert pinned.value.field == "snapshot_id" and "in use" in pinned.value.rule
        late = await tg.create_env(snapshot=snap, memory="128MiB")
        assert (await late.read_file("/testbed/a")) == b"1"
        for e in (late, other, env):
            await e.release()
        await delete_when_free(tg, snap)
        with pytest.raises(SpecError):
            await tg.get_snapshot(snap)


async def test_a_restart_keeps_snapshots_and_lists_them(image_kit: ImageKit, tmp_path: Any) -> None:
    import arl_tangram

    config = image_kit.config(image_kit.shared_store)
    async with arl_tangram.connect(config=config) as tg:
        env = await tg.create_env(image=image_kit.reference, memory="128MiB")
        await env.write_file("/testbed/kept", "yes")
        snap = await env.snapshot("before-restart")
        await env.release()
    async with arl_tangram.connect(config=config) as tg:  # a new runtime on the same store
        assert snap.snapshot_id in [s.snapshot_id for s in await tg.list_snapshots()]
        again = await tg.create_env(snapshot=snap, memory="128MiB")
        assert (await again.read_file("/testbed/kept")) == b"yes"
        await again.release()
        await delete_when_free(tg, snap)
