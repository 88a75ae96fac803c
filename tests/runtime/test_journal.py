"""The journal: its dict forms round-trip, rows commit in order off the event loop, a
request id is found before and after its row commits, and a restarted controller gives every
accepted action an outcome (never-started ones re-run, started ones and those bound to an
env end ``error`` / ``service_restarted``), with results readable and request ids idempotent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from arl_tangram.core.action import ActionSpec, Binding
from arl_tangram.core.elasticity import Amdahl, Learned, NonElastic, Table
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.runtime.actions import (
    ActionResult,
    ApiPayload,
    ExecPayload,
    NoopPayload,
    ServicePayload,
)
from arl_tangram.runtime.codec import (
    payload_from_dict,
    payload_to_dict,
    result_from_dict,
    result_to_dict,
    spec_from_dict,
    spec_to_dict,
)
from arl_tangram.runtime.config import ConfigError
from arl_tangram.runtime.embedded import EmbeddedRuntime
from arl_tangram.runtime.journal import Journal
from tests.runtime.builders import NOOP, config, exec_payload, exec_spec, noop_spec

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("model", [NonElastic(), Amdahl(0.25), Table((1.0, 0.9, 0.7))])
def test_specs_payloads_and_results_round_trip(model: object) -> None:
    spec = ActionSpec(
        "a-1", "pytest", Binding("env", "e-1"), "team", "traj-7", demand_fixed=ResourceVector(mem_bytes=5),
        demand_per_unit=ResourceVector(cpu_millicores=1000), key=ResourceKind.CPU, dop_min=1, dop_max=4,
        elasticity=model, t_ori_s=2.5, timeout_s=30.0,  # type: ignore[arg-type]
    )  # fmt: skip
    assert spec_from_dict(spec_to_dict(spec), lambda kind: Learned()) == spec
    payloads = [
        ExecPayload(("python3", "-c", "print(1)"), b"\x00\xff", (("A", "1"),), "/tmp", 5.0, "s-1"),
        ExecPayload("echo hi"), ServicePayload({"a": [1, 2]}), NoopPayload(),
        ApiPayload("GET", "/q", {"x": 1}, (("k", "v"),), 7, 3.0),
    ]  # fmt: skip
    for payload in payloads:
        assert payload_from_dict(payload_to_dict(payload)) == payload
    result = ActionResult("a-1", "pytest", "failed", 1, "out", "err", {"s": 0.5}, 0.1, 0.2, 0.3, 2, "n", "why")
    assert result_from_dict(result_to_dict(result)) == result


def test_a_learned_curve_is_read_back_as_the_kinds_current_one() -> None:
    learned = Learned()
    spec = ActionSpec("a", "build", demand_per_unit=ResourceVector(cpu_millicores=1000), key=ResourceKind.CPU,
                      dop_max=2, elasticity=Learned())  # fmt: skip
    assert spec_from_dict(spec_to_dict(spec), lambda kind: learned).elasticity is learned


def test_rows_commit_in_order_and_request_ids_are_found_before_and_after(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path / "j.sqlite"))
    try:
        spec = noop_spec(action_id="x-1")
        journal.accepted("x-1", "t", "req", spec_to_dict(spec), payload_to_dict(NOOP), 10.0)
        assert journal.lookup_request("t", "req") is not None  # queued, maybe not committed: still found
        assert journal.lookup_request("u", "req") is None
        journal.started("x-1", 11.0).result(5.0)  # resolves once committed
        journal.ended("x-1", result_to_dict(ActionResult("x-1", "noop", "succeeded")), 12.0)
        journal.flush().result(5.0)
        row = journal.lookup_request("t", "req")
        assert row is not None and row.started_wall_s == 11.0 and row.result is not None and row.result["outcome"] == "succeeded"
        with pytest.raises(SpecError, match="payload"):
            journal.accepted("x-2", "t", None, spec_to_dict(spec), {"type": "service", "request": object()}, 13.0)
        journal.accepted("x-3", "t", None, spec_to_dict(spec), payload_to_dict(NOOP), 10.0)
        journal.ended("x-3", result_to_dict(ActionResult("x-3", "noop", "succeeded")), 12.0)
        journal.accepted("x-4", "t", None, spec_to_dict(spec), payload_to_dict(NOOP), 10.0)
        journal.ended("x-4", result_to_dict(ActionResult("x-4", "noop", "succeeded")), 12.0)
        journal.acked("x-4")  # no request id: nothing will ask for it again
        journal.flush().result(5.0)
        assert [row.action_id for row in journal.load()] == ["x-1", "x-3"]
        journal.prune(11.0, 12.5)  # x-3 has no request id: kept only for its retention
        journal.flush().result(5.0)
        assert [row.action_id for row in journal.load()] == ["x-1"]
        journal.prune(12.5, 12.5)  # past the request-id window too
        journal.flush().result(5.0)
        assert journal.load() == []
    finally:
        journal.close()


def _seed(path: Path) -> dict[str, str]:
    """A journal as a crashed service would leave it; returns a label -> action id map."""
    journal = Journal(str(path))
    now = time.time()
    ids = {
        "rerun": "noop-rerun", "started": "exec-started", "env": "exec-queued", "started_free": "noop-started",
        "done": "noop-done", "acked": "noop-acked",
    }  # fmt: skip
    rows = [
        (noop_spec(action_id=ids["rerun"]), NOOP, "req-rerun"),
        (exec_spec("env-dead", action_id=ids["started"]), exec_payload("sleep 100"), None),
        (exec_spec("env-dead", action_id=ids["env"]), exec_payload("true"), None),
        (noop_spec(action_id=ids["started_free"]), NOOP, None),  # bound to nothing, but it had started
        (noop_spec(action_id=ids["done"]), NOOP, "req-done"),
        (noop_spec(action_id=ids["acked"]), NOOP, "req-acked"),
    ]
    for spec, payload, request_id in rows:
        journal.accepted(spec.action_id, spec.tenant, request_id, spec_to_dict(spec), payload_to_dict(payload), now - 5)
    journal.started(ids["started"], now - 4)
    journal.started(ids["started_free"], now - 4)
    for label in ("done", "acked"):
        journal.ended(ids[label], result_to_dict(ActionResult(ids[label], "noop", "succeeded", stdout=label)), now - 3)
    journal.acked(ids["acked"])
    journal.close()
    return ids


@pytest.mark.usefixtures("sandbox_host")
async def test_a_restart_gives_every_accepted_action_an_outcome(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    ids = _seed(path)
    runtime = await EmbeddedRuntime.start(config(journal_path=str(path)))
    try:
        c = runtime.controller
        assert (await c.wait(ids["rerun"], 5.0)).outcome == "succeeded"  # never started: ran now
        for label in ("started", "env", "started_free"):
            ended = await c.wait(ids[label], 5.0)
            assert ended.outcome == "error" and (ended.cause or "").startswith("service_restarted")
        done = c.get(ids["done"])
        assert done is not None and done.result is not None and done.result.stdout == "done"  # readable by id
        assert c.get(ids["acked"]) is None  # acknowledged before the crash: not reloaded
        again = c.submit(noop_spec(), NOOP, request_id="req-acked")  # ... but still idempotent
        assert again.spec.action_id == ids["acked"] and again.result is not None and again.result.stdout == "acked"
        assert c.submit(noop_spec(), NOOP, request_id="req-rerun").spec.action_id == ids["rerun"]
    finally:
        await runtime.aclose()
    journal = Journal(str(path))
    try:
        assert all(row.result is not None for row in journal.load())  # every outcome is durable
    finally:
        journal.close()


@pytest.mark.usefixtures("sandbox_host")
async def test_a_graceful_close_leaves_never_started_actions_to_the_next_start(tmp_path: Path) -> None:
    cfg = config(journal_path=str(tmp_path / "journal.sqlite"))
    runtime = await EmbeddedRuntime.start(cfg)
    record = runtime.controller.submit(noop_spec(), NOOP, request_id="late")
    await runtime.aclose()  # before any round ran: the caller here sees it cancelled ...
    assert record.result is not None and record.result.outcome == "cancelled"
    runtime = await EmbeddedRuntime.start(cfg)
    try:
        rerun = runtime.controller.submit(noop_spec(), NOOP, request_id="late")  # ... the journal runs it
        assert rerun.spec.action_id == record.spec.action_id
        assert (await runtime.controller.wait(rerun.spec.action_id, 5.0)).ok
    finally:
        await runtime.aclose()


@pytest.mark.usefixtures("sandbox_host")
async def test_an_unusable_journal_path_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError) as info:
        await EmbeddedRuntime.start(config(journal_path=str(tmp_path / "file" / "journal.sqlite")))
    assert info.value.field == "service.journal_path"
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"\x00" * 4096)
    with pytest.raises(ConfigError, match="SQLite"):
        await EmbeddedRuntime.start(config(journal_path=str(garbage)))
