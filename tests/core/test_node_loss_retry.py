"""Retry after node loss, in the core: a retryable action whose env did not go with its node
is queued again at its old place and started elsewhere, a bounded number of times; a late
``ActionFinished`` of the lost attempt never ends the new one; env-bound actions whose env
was on the lost node still end ``error`` / ``node_lost``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from arl_tangram.core.action import ActionSpec
from arl_tangram.core.decisions import RejectAction, RetryAction, StartAction
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import ActionFinished, ActionSubmitted, NodeJoined, NodeLost
from arl_tangram.core.scheduler import MAX_ATTEMPTS
from arl_tangram.core.topology import GpuNodeSpec
from tests.core.builders import Driver, make_action, make_cluster, make_env, make_service, of_type


def _retryable(spec: ActionSpec) -> ActionSpec:
    return replace(spec, retryable=True)


def _gpu_driver(gpu_nodes: int = 2) -> Driver:
    cluster = make_cluster(
        cpu_nodes=1, gpu_nodes=gpu_nodes, gpus_per_node=1, services={"svc": make_service()}
    )
    return Driver.of("elastic", cluster)


def _start_on_gpu(d: Driver, action: ActionSpec) -> StartAction:
    d.step([ActionSubmitted(action)])
    d.ready_everything()
    return d.starts()[action.action_id]


def test_retryable_must_be_a_boolean() -> None:
    with pytest.raises(SpecError, match="retryable"):
        replace(make_action("a"), retryable="yes")  # type: ignore[arg-type]


def test_a_retryable_service_call_is_retried_on_another_node_and_the_stale_finish_is_ignored() -> (
    None
):
    d = _gpu_driver()
    first = _start_on_gpu(d, _retryable(make_action("a", service="svc")))
    assert first.attempt == 1
    r = d.step([NodeLost(first.node_id)], now=1.0)
    (retry,) = of_type(r.decisions, RetryAction)
    assert (retry.action_id, retry.node_id, retry.attempt) == ("a", first.node_id, 1)
    assert not of_type(r.decisions, RejectAction)
    d.ready_everything(now=1.5)  # the replica loaded on the other node
    second = d.starts()["a"]
    assert second.attempt == 2 and second.node_id != first.node_id
    # The lost attempt's proxy reports late: ignored, the new attempt keeps running.
    d.step([ActionFinished("a", "error", None, attempt=1)], now=2.0)
    assert d.state.running["a"].attempt == 2
    d.step([ActionFinished("a", "succeeded", 1.0, attempt=2)], now=3.0)
    assert "a" not in d.state.running


def test_a_retry_keeps_its_arrival_time_and_its_place_in_the_queue() -> None:
    d = _gpu_driver(gpu_nodes=1)
    d.step([ActionSubmitted(_retryable(make_action("old", service="svc")))], now=0.0)
    d.ready_everything(now=0.5)
    node = d.state.running["old"].node_id
    d.step([ActionSubmitted(make_action("young", service="svc"))], now=1.0)  # waits: one device
    assert list(d.state.queue_service) == ["young"]
    d.step([NodeLost(node)], now=2.0)
    assert list(d.state.queue_service) == ["old", "young"]  # back at the head, FCFS by arrival
    assert d.state.queue_service["old"].submitted_s == 0.0
    assert d.state.queue_service["old"].attempt == 2
    # A node joins: the retried action is the one placed first.
    d.step([NodeJoined(GpuNodeSpec("gpu-new", 1))], now=3.0)
    d.ready_everything(now=3.5)
    assert d.state.running["old"].node_id == "gpu-new" and d.state.running["old"].attempt == 2
    assert "young" in d.state.queue_service


def test_retries_are_bounded() -> None:
    d = _gpu_driver(gpu_nodes=MAX_ATTEMPTS)
    start = _start_on_gpu(d, _retryable(make_action("a", service="svc")))
    for attempt in range(1, MAX_ATTEMPTS):
        r = d.step([NodeLost(start.node_id)], now=float(attempt))
        assert [x.attempt for x in of_type(r.decisions, RetryAction)] == [attempt]
        d.ready_everything(now=attempt + 0.5)
        start = d.starts()["a"]
        assert start.attempt == attempt + 1
    r = d.step([NodeLost(start.node_id)], now=10.0)
    (ended,) = of_type(r.decisions, RejectAction)
    assert ended.outcome == "error" and ended.reason.startswith("node_lost")
    assert f"attempt {MAX_ATTEMPTS} of {MAX_ATTEMPTS}" in ended.reason
    assert not of_type(r.decisions, RetryAction) and "a" not in d.state.running
    assert "a" not in d.state.queued()


def test_a_retryable_unbound_action_is_placed_again_in_the_same_round() -> None:
    d = Driver.of("elastic", make_cluster(cpu_nodes=2, cores=4))
    d.step([ActionSubmitted(_retryable(make_action("u")))])
    lost = d.state.running["u"].node_id
    r = d.step([NodeLost(lost)], now=1.0)
    assert [x.action_id for x in of_type(r.decisions, RetryAction)] == ["u"]
    (again,) = of_type(r.decisions, StartAction)
    assert again.attempt == 2 and again.node_id != lost
    assert d.state.running["u"].submitted_s == 0.0  # its queue time still counts from arrival


def test_env_bound_actions_on_the_lost_node_still_end_node_lost() -> None:
    d = Driver.of("elastic", make_cluster(cpu_nodes=2, cores=8))
    d.add_ready_env(make_env("e0"))
    node = d.state.envs["e0"].node_id
    assert node is not None
    d.step([ActionSubmitted(_retryable(make_action("a", env="e0")))])
    assert "a" in d.state.running
    r = d.step([NodeLost(node)], now=1.0)
    (ended,) = of_type(r.decisions, RejectAction)
    assert (ended.action_id, ended.outcome) == ("a", "error") and ended.reason.startswith(
        "node_lost"
    )
    assert not of_type(r.decisions, RetryAction)
    assert "a" not in d.state.running and "a" not in d.state.queued()


def test_an_unmarked_action_is_not_retried() -> None:
    d = _gpu_driver()
    first = _start_on_gpu(d, make_action("a", service="svc"))
    r = d.step([NodeLost(first.node_id)], now=1.0)
    assert not of_type(r.decisions, RetryAction)
    assert [(x.action_id, x.outcome) for x in of_type(r.decisions, RejectAction)] == [
        ("a", "error")
    ]


def test_a_finish_without_an_attempt_ends_whichever_attempt_runs() -> None:
    """Executors that never lose a node (the simulator) report no attempt."""
    d = _gpu_driver()
    first = _start_on_gpu(d, _retryable(make_action("a", service="svc")))
    d.step([NodeLost(first.node_id)], now=1.0)
    d.ready_everything(now=1.5)
    d.step([ActionFinished("a")], now=2.0)
    assert "a" not in d.state.running
