"""Image locality and pulls in the core: placement prefers nodes holding an env's layers,
pulls are deduplicated per node and layer, bounded per node, and their failures end the
envs that needed them. Driven through ``Scheduler.step`` with the invariant check."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arl_tangram.core.decisions import PlaceEnv, PullImage, RejectAction, ReleaseEnv
from arl_tangram.core.env_spec import EnvSpec, LayerNeed
from arl_tangram.core.events import (
    ActionSubmitted,
    EnvRequested,
    ImagePulled,
    ImagePullFailed,
    NodeLayersChanged,
    NodeLost,
    PrefetchRequested,
)
from arl_tangram.core.topology import ClusterSpec, CpuNodeSpec
from tests.core.builders import GIB, Driver, make_action, of_type

MIB = 1 << 20


def layer(n: int, size: int = 100 * MIB) -> LayerNeed:
    return LayerNeed(f"sha256:{n:064x}", size)


BASE, TASK_A, TASK_B = layer(1, 300 * MIB), layer(2), layer(3)
IMAGE_A, IMAGE_B = "127.0.0.1:5000/swe/a:1", "127.0.0.1:5000/swe/b:1"


def cluster(nodes: int = 2, mem: int = 1024 * GIB, pulls: int = 4) -> ClusterSpec:
    return ClusterSpec(cpu_nodes=tuple(CpuNodeSpec(f"cpu-{i}", (4,), mem, max_concurrent_pulls=pulls) for i in range(nodes)))


def image_env(env_id: str, image: str = IMAGE_A, layers: tuple[LayerNeed, ...] = (BASE, TASK_A), mem: int = GIB) -> EnvSpec:
    return EnvSpec(env_id, mem, image=image, layers=layers)


def pulled(d: PullImage, layers: tuple[LayerNeed, ...], exec_s: float = 1.0) -> ImagePulled:
    return ImagePulled(d.pull_id, d.node_id, d.image, layers, exec_s, sum(x.size_bytes for x in layers))


def test_placement_prefers_the_node_holding_the_layers() -> None:
    drv = Driver.of("elastic", cluster(2))
    # cpu-0 has more free memory (the spread rule's choice), cpu-1 has the image's layers.
    drv.step([EnvRequested(EnvSpec("host-env", 8 * GIB, image="host"))])
    drv.step([NodeLayersChanged("cpu-0", (BASE,)), NodeLayersChanged("cpu-1", (BASE, TASK_A))])
    out = drv.step([EnvRequested(image_env("e0"))])
    places = of_type(out.decisions, PlaceEnv)
    assert [(p.env_id, p.node_id) for p in places] == [("e0", "cpu-1")]
    assert not of_type(out.decisions, PullImage)
    assert "image locality" in places[0].reason


def test_without_the_layers_placement_charges_missing_bytes() -> None:
    drv = Driver.of("elastic", cluster(2))
    # cpu-0 lacks only the small task layer, cpu-1 (more free memory) lacks all: cpu-0 is sooner ready.
    drv.step([EnvRequested(EnvSpec("host-env", 8 * GIB, image="host"))])
    drv.step([NodeLayersChanged("cpu-0", (BASE,))])
    out = drv.step([EnvRequested(image_env("e0"))])
    pulls = of_type(out.decisions, PullImage)
    assert [(p.node_id, p.layers) for p in pulls] == [("cpu-0", (TASK_A.digest,))]
    assert not of_type(out.decisions, PlaceEnv)
    out = drv.step([pulled(pulls[0], (BASE, TASK_A))], now=1.0)
    assert [(p.env_id, p.node_id) for p in of_type(out.decisions, PlaceEnv)] == [("e0", "cpu-0")]


def test_500_envs_of_one_image_cause_one_pull() -> None:
    drv = Driver.of("elastic", cluster(1))
    out = drv.step([EnvRequested(image_env(f"e{i}", layers=(), mem=GIB)) for i in range(500)])
    pulls = of_type(out.decisions, PullImage)
    assert len(pulls) == 1 and pulls[0].image == IMAGE_A
    assert not of_type(out.decisions, PlaceEnv)
    assert len(drv.state.env_pulls) == 500
    out = drv.step([pulled(pulls[0], (BASE, TASK_A))], now=2.0)
    assert len(of_type(out.decisions, PlaceEnv)) == 500
    assert not of_type(drv.log, PullImage)[1:]
    # the catalog learned the image: the next env on it is placed at once
    out = drv.step([EnvRequested(image_env("late", layers=()))], now=3.0)
    assert [p.env_id for p in of_type(out.decisions, PlaceEnv)] == ["late"]


def test_envs_needing_the_same_missing_layer_wait_on_the_same_pull() -> None:
    drv = Driver.of("elastic", cluster(1))
    out = drv.step([EnvRequested(image_env("a0"))])
    (pull_a,) = of_type(out.decisions, PullImage)
    out = drv.step([EnvRequested(image_env("b0", IMAGE_B, (BASE, TASK_B)))])
    (pull_b,) = of_type(out.decisions, PullImage)
    assert pull_b.layers == (TASK_B.digest,)  # the base is already being brought by pull_a
    assert set(drv.state.env_pulls["b0"]) == {pull_a.pull_id, pull_b.pull_id}
    out = drv.step([pulled(pull_b, (BASE, TASK_B))], now=1.0)
    # b0's own pull landed with the base too: it is ready to place
    assert [p.env_id for p in of_type(out.decisions, PlaceEnv)] == ["b0"]
    out = drv.step([pulled(pull_a, (BASE, TASK_A))], now=2.0)
    assert [p.env_id for p in of_type(out.decisions, PlaceEnv)] == ["a0"]


def test_a_failed_pull_ends_every_waiting_env_with_its_cause() -> None:
    drv = Driver.of("elastic", cluster(1))
    out = drv.step([EnvRequested(image_env(f"e{i}")) for i in range(3)])
    (pull,) = of_type(out.decisions, PullImage)
    (pull_b,) = of_type(drv.step([EnvRequested(image_env("other", IMAGE_B, (BASE, TASK_B)))]).decisions, PullImage)
    drv.step([ActionSubmitted(make_action("x", env="e0"))])
    cause = f"layer: {TASK_A.digest}: registry answered 401 Unauthorized"
    out = drv.step([ImagePullFailed(pull.pull_id, pull.node_id, pull.image, cause, TASK_A.digest)], now=1.0)
    released = {d.env_id: d.reason for d in of_type(out.decisions, ReleaseEnv)}
    assert set(released) == {"e0", "e1", "e2"}
    assert all(TASK_A.digest in why and "401" in why for why in released.values())
    (rejected,) = of_type(out.decisions, RejectAction)
    assert rejected.action_id == "x" and rejected.outcome == "error" and "401" in rejected.reason
    # "other" waited on the failed pull only for the shared base: its own pull brings it now
    assert "other" in drv.state.envs and drv.state.env_pulls["other"] == (pull_b.pull_id,)
    out = drv.step([pulled(pull_b, (BASE, TASK_B))], now=2.0)
    assert [p.env_id for p in of_type(out.decisions, PlaceEnv)] == ["other"]


def test_pulls_per_node_are_bounded() -> None:
    drv = Driver.of("elastic", cluster(1, pulls=1))
    images = [f"127.0.0.1:5000/t/{i}:1" for i in range(3)]
    out = drv.step([EnvRequested(image_env(f"e{i}", img, (layer(10 + i),))) for i, img in enumerate(images)])
    started = of_type(out.decisions, PullImage)
    assert [p.image for p in started] == images[:1]
    assert len(drv.state.pulls) == 3
    out = drv.step([pulled(started[0], (layer(10),))], now=1.0)
    assert [p.image for p in of_type(out.decisions, PullImage)] == images[1:2]
    assert [p.env_id for p in of_type(out.decisions, PlaceEnv)] == ["e0"]


def test_prefetch_pulls_onto_named_nodes_lacking_the_layers() -> None:
    drv = Driver.of("elastic", cluster(3))
    drv.step([NodeLayersChanged("cpu-2", (BASE, TASK_A))])
    out = drv.step([PrefetchRequested(IMAGE_A, ("cpu-1", "cpu-2", "nowhere"), (BASE, TASK_A))])
    assert [p.node_id for p in of_type(out.decisions, PullImage)] == ["cpu-1"]
    out = drv.step([PrefetchRequested(IMAGE_A, ("cpu-1",), (BASE, TASK_A))])
    assert not of_type(out.decisions, PullImage)  # already being pulled there
    out = drv.step([PrefetchRequested(IMAGE_A)])
    assert [p.node_id for p in of_type(out.decisions, PullImage)] == ["cpu-0"]


def test_a_lost_node_answers_the_envs_waiting_on_its_pulls() -> None:
    drv = Driver.of("elastic", cluster(1))
    drv.step([EnvRequested(image_env("e0"))])
    out = drv.step([NodeLost("cpu-0")], now=1.0)
    (release,) = of_type(out.decisions, ReleaseEnv)
    assert release.env_id == "e0" and release.node_id is None and "node_lost" in release.reason
    assert not drv.state.pulls and not drv.state.env_pulls


def test_host_envs_ignore_images() -> None:
    drv = Driver.of("elastic", cluster(2))
    out = drv.step([EnvRequested(EnvSpec("h", GIB))])
    assert [p.node_id for p in of_type(out.decisions, PlaceEnv)] == ["cpu-0"]
    assert not drv.state.pulls


_IMAGES = {i: (f"127.0.0.1:5000/p/{i}:1", (layer(1), layer(100 + i))) for i in range(4)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["env", "land", "fail", "prefetch", "release"]), st.integers(0, 3)), max_size=40))
def test_pull_bookkeeping_holds_under_any_order(ops: list[tuple[str, int]]) -> None:
    drv = Driver.of("elastic", cluster(2, mem=8 * GIB, pulls=2))
    n = 0
    for op, i in ops:
        image, layers = _IMAGES[i]
        running = sorted(p for p, s in drv.state.pulls.items() if s.expected_end_s is not None)
        if op == "env":
            drv.step([EnvRequested(image_env(f"e{n}", image, layers if i % 2 else ()))], now=drv.now + 0.1)
            n += 1
        elif op in ("land", "fail") and running:
            pull = drv.state.pulls[running[i % len(running)]]
            _, pull_layers = next(v for v in _IMAGES.values() if v[0] == pull.image)
            if op == "land":
                drv.step([ImagePulled(pull.pull_id, pull.node_id, pull.image, pull_layers, 0.5, 1)], now=drv.now + 0.1)
            else:
                drv.step([ImagePullFailed(pull.pull_id, pull.node_id, pull.image, "registry: 500", pull_layers[-1].digest)])
        elif op == "prefetch":
            drv.step([PrefetchRequested(image)])
        elif op == "release" and drv.state.envs:
            from arl_tangram.core.events import EnvReleased

            drv.step([EnvReleased(sorted(drv.state.envs)[i % len(drv.state.envs)])])
        for node_id in drv.state.cpu:  # no two pulls on a node claim one layer
            claimed = [x.digest for p in drv.state.pulls.values() if p.node_id == node_id for x in p.layers]
            assert len(claimed) == len(set(claimed))
    placed = {d.env_id for d in of_type(drv.log, PlaceEnv)}
    for env_id in drv.state.envs:  # every live env is created, pending, or waits
        assert env_id in placed or env_id in drv.state.env_queue or env_id in drv.state.env_pulls
