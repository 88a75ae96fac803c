"""Core: image locality and image pulls as actions of their own.

Which layers each node holds is state (``node_layers``, reported by ``NodeLayersChanged``
and grown by ``ImagePulled``); so is a catalog of the layers each image reference is made
of (``image_layers``: from env specs that carry them, and from every pull). An env on an
image is assigned a node like any env (its memory held from then on); if the node lacks
some of its layers the env waits for the pulls that bring them (``env_pulls``) and its
``PlaceEnv`` comes when the last one lands.

A pull is per (node, image). It *claims* the missing layers no other pull on that node
brings, so two envs needing the same missing layer wait on the same pull, and 500 envs of
one image cause one pull per node. At most ``CpuNodeSpec.max_concurrent_pulls`` run on a
node at once; the others wait here in FCFS order. A failed pull ends every env that needs
what it was bringing ``error`` with its cause (the scheduler ends them); an env that only
waited on it for a shared layer claims that layer with a pull of its own instead.

Placement charges the time until an env's layers are on a node (``ready_in_s``): zero on a
node that holds them, what is left of an in-flight pull that brings them, else the missing
bytes over the node's pull+unpack bandwidth (measured by pulls, a prior before).
"""

from __future__ import annotations

from dataclasses import replace

from arl_tangram.core import ledger
from arl_tangram.core.decisions import Decision, PullImage
from arl_tangram.core.env_spec import EnvSpec, LayerNeed
from arl_tangram.core.events import (
    ImagePulled,
    ImagePullFailed,
    NodeLayersChanged,
    PrefetchRequested,
)
from arl_tangram.core.resources import ResourceVector
from arl_tangram.core.state import PullState, StateEditor

#: bytes charged for an image whose layers nobody has reported yet (only a pull tells)
UNKNOWN_IMAGE_BYTES = 1 << 30
RATE_WEIGHT = 0.3  # weight of the newest measured bandwidth in the node's moving average


def layers_of(ed: StateEditor, spec: EnvSpec) -> tuple[LayerNeed, ...] | None:
    """The layers ``spec``'s image needs: the spec's own, else the catalog's; None: unknown."""
    if not spec.on_image:
        return ()
    return spec.layers or ed.image_layers.get(spec.image)


def pull_bytes_per_s(ed: StateEditor, node_id: str) -> float:
    """The node's pull+unpack bandwidth: measured by its pulls, else its spec's prior."""
    measured = ed.pull_rate.get(node_id)
    if measured is not None:
        return measured
    for node in ed.spec.cpu_nodes:
        if node.node_id == node_id:
            return node.pull_bytes_per_s
    return 1.0


def _pulls_on(ed: StateEditor, node_id: str) -> list[PullState]:
    return sorted((p for p in ed.pulls.values() if p.node_id == node_id), key=lambda p: p.seq)


def _remaining_s(ed: StateEditor, pull: PullState) -> float:
    """What is left of a pull: until its expected end if it runs, else its whole length
    after the first running pull on its node ends."""
    if pull.expected_end_s is not None:
        return max(0.0, pull.expected_end_s - ed.now_s)
    rate = pull_bytes_per_s(ed, pull.node_id)
    ahead = [p.expected_end_s - ed.now_s for p in _pulls_on(ed, pull.node_id) if p.expected_end_s is not None]
    size = sum(layer.size_bytes for layer in pull.layers) or UNKNOWN_IMAGE_BYTES
    return max(0.0, min(ahead, default=0.0)) + size / rate


def ready_in_s(ed: StateEditor, node_id: str, spec: EnvSpec) -> float:
    """Estimated seconds until ``spec``'s image layers are all on ``node_id`` (0: they are)."""
    layers = layers_of(ed, spec)
    if layers == ():
        return 0.0
    pulls = _pulls_on(ed, node_id)
    if layers is None:
        own = [p for p in pulls if p.image == spec.image]
        return _remaining_s(ed, own[0]) if own else UNKNOWN_IMAGE_BYTES / pull_bytes_per_s(ed, node_id)
    held = ed.node_layers.get(node_id, {})
    claims = {layer.digest: p for p in pulls for layer in p.layers}
    wait = 0.0
    unclaimed = 0
    for layer in layers:
        if layer.digest in held:
            continue
        if layer.digest in claims:
            wait = max(wait, _remaining_s(ed, claims[layer.digest]))
        else:
            unclaimed += layer.size_bytes
    return max(wait, unclaimed / pull_bytes_per_s(ed, node_id)) if unclaimed else wait


def assign_env(ed: StateEditor, env_id: str, node_id: str, held: ResourceVector, reason: str, cause: str) -> list[Decision]:
    """Place a pending env on ``node_id`` (``held`` taken now): its ``PlaceEnv`` at once if
    the node has its image's layers, else the pulls it now waits on."""
    ledger.assign_env(ed, env_id, node_id, held)
    return advance_env(ed, env_id, reason, cause)


def advance_env(ed: StateEditor, env_id: str, reason: str, cause: str) -> list[Decision]:
    """An assigned env whose waits changed: create it if its layers are all on its node,
    else (re)compute the pulls it waits on, requesting its own for layers nobody brings."""
    env = ed.envs[env_id]
    node_id = env.node_id
    assert node_id is not None
    layers = layers_of(ed, env.spec)
    held = ed.node_layers.get(node_id, {})
    need = None if layers is None else [layer for layer in layers if layer.digest not in held]
    if need == []:
        ed.w("env_pulls").pop(env_id, None)
        return [ledger.place_env_order(ed, env_id, reason, cause)]
    pulls = _pulls_on(ed, node_id)
    own = next((p for p in pulls if p.image == env.spec.image), None)
    waits: set[str] = set()
    decisions: list[Decision] = []
    unclaimed: list[LayerNeed] = []
    if need is None:
        waits.add(own.pull_id if own is not None else "")
    else:
        claims = {layer.digest: p.pull_id for p in pulls for layer in p.layers}
        waits = {claims[layer.digest] for layer in need if layer.digest in claims}
        unclaimed = [layer for layer in need if layer.digest not in claims]
        if unclaimed and own is not None:
            waits.add(own.pull_id)  # it brings the whole image, whatever it claimed
            unclaimed = []
    if "" in waits or unclaimed:
        waits.discard("")
        pull, decisions = request_pull(ed, node_id, env.spec.image, tuple(unclaimed), f"env {env_id} needs its layers", cause)
        waits.add(pull.pull_id)
    ed.w("env_pulls")[env_id] = tuple(sorted(waits))
    return decisions


def request_pull(
    ed: StateEditor, node_id: str, image: str, layers: tuple[LayerNeed, ...], reason: str, cause: str
) -> tuple[PullState, list[Decision]]:
    """Queue a pull of ``image`` on ``node_id`` claiming ``layers``; started at once if the
    node has a free pull slot."""
    pull = PullState(f"pull:{image}@{node_id}#{ed.next_seq()}", node_id, image, layers, ed.seq, ed.now_s, reason=reason)
    ed.w("pulls")[pull.pull_id] = pull
    return pull, start_queued(ed, node_id, cause)


def start_queued(ed: StateEditor, node_id: str, cause: str) -> list[Decision]:
    """Start queued pulls on ``node_id`` (FCFS) while it has free pull slots."""
    node = next((n for n in ed.spec.cpu_nodes if n.node_id == node_id), None)
    if node is None:
        return []
    pulls = _pulls_on(ed, node_id)
    slots = node.max_concurrent_pulls - sum(1 for p in pulls if p.expected_end_s is not None)
    decisions: list[Decision] = []
    for pull in (p for p in pulls if p.expected_end_s is None):
        if slots <= 0:
            break
        size = sum(layer.size_bytes for layer in pull.layers) or UNKNOWN_IMAGE_BYTES
        end_s = ed.now_s + size / pull_bytes_per_s(ed, node_id)
        ed.w("pulls")[pull.pull_id] = replace(pull, expected_end_s=end_s)
        digests = tuple(layer.digest for layer in pull.layers)
        decisions.append(PullImage(pull.pull_id, node_id, pull.image, digests, pull.reason, cause))
        slots -= 1
    return decisions


def _waiters(ed: StateEditor, pull_id: str) -> list[str]:
    return sorted(e for e, waits in ed.env_pulls.items() if pull_id in waits)


def on_pulled(ed: StateEditor, event: ImagePulled, cause: str) -> list[Decision]:
    """A pull landed: its node holds the image's layers, the catalog knows them, its node's
    bandwidth is measured; envs that waited only on it are created (or wait on the rest)."""
    pull = ed.pulls.get(event.pull_id)
    if event.node_id in ed.cpu:
        on_node = dict(ed.node_layers.get(event.node_id, {}))
        on_node.update((layer.digest, layer.size_bytes) for layer in event.layers)
        ed.w("node_layers")[event.node_id] = on_node
        if event.exec_s and event.fetched_bytes > 0:
            rate = event.fetched_bytes / event.exec_s
            old = ed.pull_rate.get(event.node_id)
            ed.w("pull_rate")[event.node_id] = rate if old is None else (1 - RATE_WEIGHT) * old + RATE_WEIGHT * rate
    if event.layers:
        ed.w("image_layers")[event.image] = tuple(event.layers)
    if pull is None:
        return []
    del ed.w("pulls")[event.pull_id]
    decisions = start_queued(ed, pull.node_id, cause)
    held = ed.node_layers.get(pull.node_id, {})
    for env_id in sorted(e for e in ed.env_pulls if ed.envs[e].node_id == pull.node_id):
        waits = tuple(w for w in ed.env_pulls[env_id] if w != event.pull_id)
        ed.w("env_pulls")[env_id] = waits
        layers = layers_of(ed, ed.envs[env_id].spec)
        # Its layers may have come with another image's pull than the ones it waited on.
        if not waits or (layers and all(x.digest in held for x in layers)):
            decisions += advance_env(ed, env_id, f"image {pull.image} pulled on {pull.node_id}", cause)
    return decisions


def on_pull_failed(ed: StateEditor, event: ImagePullFailed, cause: str) -> tuple[list[str], list[Decision]]:
    """A pull failed: the envs that needed what it brought (its image, or the failing layer,
    or any layer when the image's are unknown) are returned for the scheduler to end
    ``error``; the others re-plan their waits."""
    pull = ed.pulls.get(event.pull_id)
    if pull is None:
        return [], []
    del ed.w("pulls")[event.pull_id]
    doomed: list[str] = []
    decisions = start_queued(ed, pull.node_id, cause)
    for env_id in _waiters(ed, event.pull_id):
        spec = ed.envs[env_id].spec
        layers = layers_of(ed, spec)
        if spec.image == pull.image or layers is None or any(layer.digest == event.layer for layer in layers):
            doomed.append(env_id)
            continue
        ed.w("env_pulls")[env_id] = tuple(w for w in ed.env_pulls[env_id] if w != event.pull_id)
        decisions += advance_env(ed, env_id, f"pull {event.pull_id} failed; claimed its layers anew", cause)
    return doomed, decisions


def on_layers_changed(ed: StateEditor, event: NodeLayersChanged) -> None:
    """A node reported the layers it holds (at join, after a collection): they replace ours."""
    if event.node_id in ed.cpu:
        ed.w("node_layers")[event.node_id] = {layer.digest: layer.size_bytes for layer in event.layers}


def prefetch(ed: StateEditor, event: PrefetchRequested, cause: str) -> list[Decision]:
    """Pull ``event.image`` onto the named nodes (every CPU node when none is named) that
    lack some of its layers and have no pull of it yet. Unknown nodes are skipped."""
    nodes = event.node_ids or tuple(sorted(ed.cpu))
    if event.layers and event.image not in ed.image_layers:
        ed.w("image_layers")[event.image] = tuple(event.layers)
    probe = EnvSpec("prefetch", 0, image=event.image, layers=event.layers)
    decisions: list[Decision] = []
    for node_id in nodes:
        if node_id not in ed.cpu or ready_in_s(ed, node_id, probe) == 0.0:
            continue
        pulls = _pulls_on(ed, node_id)
        if any(p.image == event.image for p in pulls):
            continue
        layers = layers_of(ed, probe) or ()
        claimed = {layer.digest for p in pulls for layer in p.layers}
        held = ed.node_layers.get(node_id, {})
        mine = tuple(layer for layer in layers if layer.digest not in held and layer.digest not in claimed)
        decisions += request_pull(ed, node_id, event.image, mine, "prefetch", cause)[1]
    return decisions


def drop_node(ed: StateEditor, node_id: str) -> list[str]:
    """Forget a lost node's layers and pulls; returns the envs that were waiting there."""
    ed.w("node_layers").pop(node_id, None)
    ed.w("pull_rate").pop(node_id, None)
    for pull_id in [p.pull_id for p in _pulls_on(ed, node_id)]:
        del ed.w("pulls")[pull_id]
    waiting = sorted(e for e in ed.env_pulls if ed.envs.get(e) is not None and ed.envs[e].node_id == node_id)
    for env_id in waiting:
        del ed.w("env_pulls")[env_id]
    return waiting

