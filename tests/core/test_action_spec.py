"""ActionSpec validation: each bad input raises SpecError naming the field and the rule."""

from __future__ import annotations

import math

import pytest

from arl_tangram.core.action import ActionSpec, Binding, EnvSpec, ServiceSpec
from arl_tangram.core.decisions import RejectAction, StartAction
from arl_tangram.core.elasticity import Amdahl, Learned, NonElastic, Table
from arl_tangram.core.errors import SpecError
from arl_tangram.core.events import ActionSubmitted
from arl_tangram.core.resources import ResourceKind, ResourceVector
from arl_tangram.core.state import ClusterState
from arl_tangram.core.topology import QuotaPoolSpec, check_can_ever_fit
from tests.core.builders import GIB, MC, Driver, make_action, make_cluster, make_env, make_service

CPU1 = ResourceVector(cpu_millicores=MC)


def spec(**overrides: object) -> ActionSpec:
    base: dict[str, object] = {
        "action_id": "a",
        "kind": "test",
        "binding": Binding("env", "e0"),
        "demand_per_unit": CPU1,
        "key": ResourceKind.CPU,
        "dop_min": 1,
        "dop_max": 4,
        "elasticity": NonElastic(),
        "t_ori_s": 1.0,
    }
    base.update(overrides)
    return ActionSpec(**base)  # type: ignore[arg-type]


def test_valid_spec_builds_and_reports_its_demand() -> None:
    s = spec(demand_fixed=ResourceVector(mem_bytes=GIB))
    assert s.demand_at(3) == ResourceVector(cpu_millicores=3 * MC, mem_bytes=GIB)
    assert s.demand_min == ResourceVector(cpu_millicores=MC, mem_bytes=GIB)


@pytest.mark.parametrize("where", ["demand_fixed", "demand_per_unit"])
@pytest.mark.parametrize("kind", ["cpu", "mem", "gpu", "quota"])
def test_negative_demand_names_field_and_rule(where: str, kind: str) -> None:
    vec = ResourceVector.from_mapping({kind: -1})
    overrides: dict[str, object] = {where: vec}
    with pytest.raises(SpecError) as info:
        spec(**overrides)
    assert info.value.field == f"{where}.{kind}"
    assert ">= 0" in info.value.rule
    assert f"{where}.{kind}" in str(info.value) and ">= 0" in str(info.value)


def test_non_integer_demand_is_rejected() -> None:
    with pytest.raises(SpecError) as info:
        spec(demand_fixed=ResourceVector(mem_bytes=1.5))  # type: ignore[arg-type]
    assert info.value.field == "demand_fixed.mem"
    assert "integer" in info.value.rule


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_demand_raises_spec_error(value: float) -> None:
    with pytest.raises(SpecError) as info:
        spec(demand_fixed=ResourceVector(cpu_millicores=value))  # type: ignore[arg-type]
    assert info.value.field == "demand_fixed.cpu"


def test_dop_min_above_dop_max() -> None:
    with pytest.raises(SpecError) as info:
        spec(dop_min=5, dop_max=4)
    assert info.value.field == "dop_min"
    assert "<= dop_max" in info.value.rule
    assert "dop_min" in str(info.value) and "dop_max" in str(info.value)


@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_dop_must_be_positive_integer(value: object) -> None:
    with pytest.raises(SpecError) as info:
        spec(dop_min=value)
    assert info.value.field == "dop_min"
    assert "integer >= 1" in info.value.rule


def test_unknown_resource_kind_in_mapping() -> None:
    with pytest.raises(SpecError) as info:
        ResourceVector.from_mapping({"tpu": 1})
    assert info.value.field == "demand.tpu"
    assert "resource kinds" in info.value.rule and "cpu" in info.value.rule
    assert "tpu" in str(info.value)


def test_unknown_resource_kind_parse() -> None:
    with pytest.raises(SpecError) as info:
        ResourceKind.parse("tpu")
    assert info.value.field == "key"
    assert "must be one of the resource kinds" in info.value.rule
    assert ResourceKind.parse("gpu") is ResourceKind.GPU


def test_key_must_be_a_resource_kind() -> None:
    with pytest.raises(SpecError) as info:
        spec(key="cpu")
    assert info.value.field == "key"


@pytest.mark.parametrize("name", ["t_ori_s", "timeout_s"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0.0, -1.0])
def test_non_finite_or_non_positive_times(name: str, value: float) -> None:
    with pytest.raises(SpecError) as info:
        spec(**{name: value})
    assert info.value.field == name
    assert "finite" in info.value.rule and "> 0" in info.value.rule


def test_none_times_mean_unknown_and_are_allowed() -> None:
    s = spec(t_ori_s=None, timeout_s=None)
    assert s.t_ori_s is None and s.timeout_s is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1, 1.5])
def test_amdahl_serial_fraction_must_be_finite_in_unit_interval(value: float) -> None:
    with pytest.raises(SpecError) as info:
        Amdahl(value)
    assert info.value.field == "elasticity.serial_fraction"
    assert "finite" in info.value.rule and "[0, 1]" in info.value.rule


@pytest.mark.parametrize(
    ("table", "bad_index"),
    [((1.0, math.nan), 1), ((math.inf,), 0), ((1.0, 0.9, 0.0), 2), ((1.0, 1.2), 1), ((-0.5,), 0)],
)
def test_table_efficiencies_must_be_finite_in_range(table: tuple[float, ...], bad_index: int) -> None:
    with pytest.raises(SpecError) as info:
        Table(table)
    assert info.value.field == f"elasticity.efficiencies[{bad_index}]"
    assert "finite" in info.value.rule


def test_empty_table_is_rejected() -> None:
    with pytest.raises(SpecError) as info:
        Table(())
    assert info.value.field == "elasticity.efficiencies"


@pytest.mark.parametrize(("lo", "hi", "bad_field"), [(3, 4, "dop_min"), (1, 6, "dop_max"), (1, 16, "dop_max")])
def test_gpu_dop_must_be_a_chunk_size(lo: int, hi: int, bad_field: str) -> None:
    with pytest.raises(SpecError) as info:
        spec(
            binding=Binding("service", "svc"), demand_per_unit=ResourceVector(gpu_devices=1),
            key=ResourceKind.GPU, dop_min=lo, dop_max=hi,
        )
    assert info.value.field == bad_field
    assert "{1, 2, 4, 8}" in info.value.rule


def test_no_key_means_dop_max_one() -> None:
    with pytest.raises(SpecError) as info:
        spec(key=None, demand_per_unit=ResourceVector(), dop_max=2)
    assert info.value.field == "dop_max"
    assert "must be 1" in info.value.rule and "key" in info.value.rule


def test_key_resource_needs_a_per_unit_demand() -> None:
    with pytest.raises(SpecError) as info:
        spec(demand_per_unit=ResourceVector(mem_bytes=GIB))
    assert info.value.field == "demand_per_unit.cpu"
    assert "> 0" in info.value.rule


def test_binding_rules() -> None:
    with pytest.raises(SpecError) as info:
        Binding("gpu", "x")  # type: ignore[arg-type]
    assert info.value.field == "binding.kind"
    with pytest.raises(SpecError) as info:
        Binding("env", "")
    assert info.value.field == "binding.name"


def test_empty_ids_and_other_specs() -> None:
    with pytest.raises(SpecError, match="^action_id: "):
        spec(action_id="")
    with pytest.raises(SpecError, match="^kind: "):
        spec(kind="")
    with pytest.raises(SpecError, match="^mem_bytes: "):
        EnvSpec("e", -1)
    with pytest.raises(SpecError, match="^weight_bytes: "):
        ServiceSpec("s", 0)
    with pytest.raises(SpecError, match="^devices_max: "):
        ServiceSpec("s", 1, 1, 3)
    with pytest.raises(SpecError, match="^devices_min: .*<= devices_max"):
        ServiceSpec("s", 1, 4, 2)


# --- a demand no node can ever hold -------------------------------------------------


def test_check_can_ever_fit_cpu_too_large() -> None:
    cluster = make_cluster(cpu_nodes=2, cores=8)
    too_big = make_action("big", env="e0", dop_min=9, dop_max=16)
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(too_big, cluster)
    assert info.value.field == "demand"
    assert "fit on at least one CPU node" in info.value.rule
    check_can_ever_fit(make_action("ok", env="e0", dop_min=8, dop_max=16), cluster)


def test_check_can_ever_fit_memory_too_large() -> None:
    cluster = make_cluster(mem_bytes=4 * GIB)
    a = make_action("m", env="e0", fixed=ResourceVector(cpu_millicores=MC, mem_bytes=5 * GIB))
    with pytest.raises(SpecError, match="^demand: "):
        check_can_ever_fit(a, cluster)


def test_check_can_ever_fit_gpu_service_and_api() -> None:
    cluster = make_cluster(
        gpu_nodes=1, gpus_per_node=4, services={"svc": make_service("svc", devices_min=8, devices_max=8)},
        quota_pools=[QuotaPoolSpec("api", 2, 1.0)],
    )
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(make_action("g", service="svc"), cluster)
    assert info.value.field == "dop_min" and "largest GPU node" in info.value.rule
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(make_action("g", service="nope"), cluster)
    assert info.value.field == "binding.name" and "registered service" in info.value.rule
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(make_action("q", api="api", fixed=ResourceVector(quota_tokens=3)), cluster)
    assert info.value.field == "demand.quota"
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(make_action("q", api="other"), cluster)
    assert info.value.field == "binding.name" and "API provider" in info.value.rule


def test_check_can_ever_fit_service_dop_outside_the_services_sizes() -> None:
    """A service action whose DoP range misses the service's replica sizes can never run."""
    cluster = make_cluster(gpu_nodes=1, services={"svc": make_service("svc", devices_min=1, devices_max=4)})
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(make_action("g", service="svc", dop_min=8, dop_max=8), cluster)
    assert info.value.field == "dop_min"
    check_can_ever_fit(make_action("g", service="svc", dop_min=4, dop_max=8), cluster)


def test_gpu_demand_must_be_bound_to_a_service() -> None:
    cluster = make_cluster(gpu_nodes=1)
    a = ActionSpec("g", "x", Binding(), demand_fixed=ResourceVector(gpu_devices=1))
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(a, cluster)
    assert info.value.field == "key"


@pytest.mark.parametrize("policy", ["elastic", "k8s-static", "task-pool", "fixed-dop", "ideal"])
def test_submitting_an_impossible_demand_is_rejected_naming_the_field(policy: str) -> None:
    d = Driver.of(policy, make_cluster(cpu_nodes=1, cores=8))
    d.add_ready_env(make_env("e0"))
    result = d.step([ActionSubmitted(make_action("big", env="e0", dop_min=12, dop_max=16))])
    rejects = [x for x in result.decisions if isinstance(x, RejectAction)]
    assert [r.action_id for r in rejects] == ["big"]
    assert rejects[0].reason.startswith("demand:")
    assert "fit on at least one CPU node" in rejects[0].reason
    assert rejects[0].cause == "ActionSubmitted(big)"
    assert "big" not in d.state.queued() and "big" not in d.state.running


def test_submit_rejections_for_unknown_env_and_duplicate_id() -> None:
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    r = d.step([ActionSubmitted(make_action("x", env="ghost"))])
    assert isinstance(r.decisions[0], RejectAction) and r.decisions[0].reason.startswith("binding.name")
    r = d.step([ActionSubmitted(make_action("a", env="e0", t_ori_s=5.0))])
    assert isinstance(r.decisions[0], StartAction)
    r = d.step([ActionSubmitted(make_action("a", env="e0"))])
    assert [type(x) for x in r.decisions] == [RejectAction]
    assert r.decisions[0].reason.startswith("action_id")
    assert "a" in d.state.running  # the original keeps running


def test_learned_elasticity_is_schedulable() -> None:
    """An action whose elasticity is learned online must be schedulable like any other."""
    d = Driver.of("elastic", make_cluster(cores=8))
    d.add_ready_env(make_env("e0"))
    r = d.step([ActionSubmitted(make_action("a", env="e0", dop_max=8, elasticity=Learned(), t_ori_s=4.0))])
    starts = [x for x in r.decisions if isinstance(x, StartAction)]
    assert [s.action_id for s in starts] == ["a"]
    assert 1 <= starts[0].dop <= 8


def test_initial_state_is_valid_and_empty() -> None:
    state = ClusterState.initial(make_cluster(cpu_nodes=2, cores=8, gpu_nodes=1))
    assert state.cpu["cpu-0"].free_millicores == 8 * MC
    assert state.cpu["cpu-0"].numa_free == (4 * MC, 4 * MC)
    assert state.gpu == {"gpu-0": 0}
    assert not state.queued() and not state.running


def test_a_generating_services_kv_cache_counts_in_its_device_footprint() -> None:
    """The KV cache a generating replica reserves (max batch x max context) sits on its first
    device beside that device's share of the weights: a replica whose weights fit but whose
    cache does not can never run, and one that fits when split is placed split."""
    gib = 1 << 30
    judge = ServiceSpec("judge", 60 * gib, 1, 2, kv_cache_bytes=30 * gib)
    assert judge.device_bytes(1) == 90 * gib and judge.device_bytes(2) == 60 * gib
    one = make_cluster(gpu_nodes=1, gpus_per_node=1, services={"judge": judge})
    with pytest.raises(SpecError) as info:
        check_can_ever_fit(make_action("g", service="judge", dop_min=1, dop_max=2), one)
    assert info.value.field == "binding.name" and "KV cache" in info.value.rule
    two = make_cluster(gpu_nodes=1, gpus_per_node=2, services={"judge": judge})
    check_can_ever_fit(make_action("g", service="judge", dop_min=1, dop_max=2), two)
    plain = make_cluster(gpu_nodes=1, gpus_per_node=1, services={"judge": ServiceSpec("judge", 60 * gib)})
    check_can_ever_fit(make_action("g", service="judge"), plain)
    with pytest.raises(SpecError) as info:
        ServiceSpec("judge", gib, kv_cache_bytes=-1)
    assert info.value.field == "kv_cache_bytes"
