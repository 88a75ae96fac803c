"""The bookkeeping under leases and retention, on a virtual clock: the lease table's due
list, renewals and per-tenant counts; the action store's retention, acknowledgement and
request-id index, and its counts of unfinished actions."""

from __future__ import annotations

import pytest

from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.actions import ActionResult, ActionStore
from arl_tangram.runtime.leases import EnvLeases
from arl_tangram.runtime.loop import ManualClock
from tests.runtime.builders import NOOP, exec_payload, exec_spec, noop_spec

pytestmark = pytest.mark.anyio


def test_leases_fall_due_after_the_idle_ttl_unless_used_or_busy() -> None:
    leases = EnvLeases(idle_ttl_s=10.0)
    leases.add("e-b", "t", 100, now_s=0.0)
    leases.add("e-a", "t", 50, now_s=0.0)
    leases.add("e-c", "u", 7, now_s=0.0)
    assert leases.due(9.9, busy=lambda e: False) == []
    assert leases.renew("e-b", 5.0) and not leases.renew("absent", 5.0)
    due = leases.due(10.0, busy=lambda e: e == "e-c")  # e-c runs an action: renewed, not due
    assert [lease.env_id for lease in due] == ["e-a"]
    assert [lease.env_id for lease in leases.due(15.0, busy=lambda e: False)] == ["e-a", "e-b"]
    assert leases.due(19.9, busy=lambda e: False)[-1].env_id == "e-b"  # e-c counts from 10.0
    assert (leases.envs_of("t"), leases.mem_bytes_of("t")) == (2, 150)
    leases.drop("e-a")
    leases.drop("e-a")  # idempotent
    assert (leases.envs_of("t"), leases.mem_bytes_of("t"), leases.envs_of("u")) == (1, 100, 1)


async def test_the_store_keeps_results_until_ack_or_retention() -> None:
    clock = ManualClock(0.0)
    store = ActionStore(clock.now)
    ended: list[str] = []
    store.on_complete = lambda record: ended.append(record.spec.action_id)
    a = store.add(noop_spec(tenant="t", action_id="a"), NOOP, 0.0, request_id="r")
    store.add(noop_spec(tenant="t", action_id="b"), NOOP, 0.0)
    assert (store.num_unfinished, store.unfinished_of("t")) == (2, 2)
    with pytest.raises(SpecError, match="request_id"):
        store.add(noop_spec(tenant="t", action_id="c"), NOOP, 0.0, request_id="r")
    assert not store.forget("a")  # unfinished: kept
    clock.now_s = 1.0
    assert store.complete("a", ActionResult("a", "noop", "succeeded"))
    assert not store.complete("a", ActionResult("a", "noop", "failed"))  # first wins
    clock.now_s = 2.0
    store.complete("b", ActionResult("b", "noop", "succeeded"))
    assert ended == ["a", "b"] and a.ended_s == 1.0 and store.num_unfinished == 0 and store.unfinished_of("t") == 0
    assert store.by_request("t", "r") is a and store.by_request("u", "r") is None
    assert store.expire(ended_before_s=1.5) == ["a"] and store.get("a") is None and store.by_request("t", "r") is None
    assert store.forget("b") and store.expire(ended_before_s=10.0) == [] and len(store) == 0


async def test_the_store_counts_each_envs_unfinished_actions() -> None:
    store = ActionStore(ManualClock(0.0).now)
    store.add(exec_spec("e-1", action_id="x"), exec_payload("true"), 0.0)
    store.add(exec_spec("e-1", action_id="y"), exec_payload("true"), 0.0)
    assert (store.unfinished_on("e-1"), store.unfinished_on("e-2")) == (2, 0)
    store.complete("x", ActionResult("x", "exec", "succeeded"))
    store.complete("y", ActionResult("y", "exec", "cancelled"))
    assert store.unfinished_on("e-1") == 0
