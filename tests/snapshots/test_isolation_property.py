"""Isolation, as a property: random sequences of writes, deletes (whiteouts over the image's
files), renames, directory replacements (opaque directories), snapshots, forks and rollbacks
on a parent and its children; at the end every env's view of ``/testbed/d`` equals a model of
what it should see. The store squashes past depth 2, so squashed stacks are covered too."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.snapshots.node_kit import Node

pytestmark = pytest.mark.usefixtures("sandbox_host")

NAMES = ("a", "b", "sub/c")
LIST = "export LC_ALL=C; shopt -s globstar nullglob; cd /testbed/d && for f in **; do [ -f \"$f\" ] && printf '%s=%s\\n' \"$f\" \"$(<\"$f\")\"; done; true"
Op = tuple[str, int, str, str]
ops = st.lists(
    st.tuples(
        st.sampled_from(("write", "delete", "rename", "redir", "snapshot", "fork", "rollback")),
        st.integers(0, 7), st.sampled_from(NAMES), st.sampled_from(NAMES),
    ),
    min_size=1, max_size=9,
)  # fmt: skip


def view(model: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(model.items()))


def apply(node: Node, env: str, model: dict[str, str], op: Op, step: int) -> None:
    kind, _, a, b = op
    if kind == "write":
        node.sh(env, f"mkdir -p /testbed/d/sub && echo -n {step} > /testbed/d/{a}")
        model[a] = str(step)
    elif kind == "delete":
        node.sh(env, f"rm -f /testbed/d/{a}")
        model.pop(a, None)
    elif kind == "rename" and a in model and a != b:
        node.sh(env, f"mkdir -p /testbed/d/sub && mv /testbed/d/{a} /testbed/d/{b}")
        model[b] = model.pop(a)
    elif kind == "redir":  # the whole directory replaced: an opaque directory in the upper
        node.sh(env, f"rm -rf /testbed/d/sub && mkdir /testbed/d/sub && echo -n {step} > /testbed/d/sub/n{step}")
        for k in [k for k in model if k.startswith("sub/")]:
            del model[k]
        model[f"sub/n{step}"] = str(step)


# no shrinking: each step runs real sandboxes; a failure reports its whole sequence
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(ops)
# squashes of an opaque directory and of a whiteout over a lower snapshot's file, every time
@example([("snapshot", 0, "a", "a"), ("redir", 0, "a", "a"), ("snapshot", 0, "a", "a"), ("fork", 0, "a", "a")])
@example([("snapshot", 0, "a", "a"), ("delete", 0, "a", "a"), ("rename", 0, "sub/c", "b"), ("fork", 0, "a", "a"),
          ("fork", 1, "a", "a"), ("rollback", 2, "a", "a")])  # fmt: skip
# a rollback leaves the snapshots taken after its target: they are no longer ancestors
@example([("snapshot", 0, "a", "a"), ("snapshot", 0, "a", "a"), ("rollback", 0, "a", "a"), ("rollback", 1, "a", "a")])
def test_every_env_sees_its_model(node: Node, sequence: list[Op]) -> None:
    root = node.create()
    node.sh(root, "mkdir -p /testbed/d/sub && echo -n i > /testbed/d/a && echo -n i > /testbed/d/sub/c")
    envs = {root: {"a": "i", "sub/c": "i"}}
    lineage: dict[str, list[tuple[str, dict[str, str]]]] = {root: []}  # env -> snapshots it descends from
    try:
        for step, op in enumerate(sequence):
            env = sorted(envs)[op[1] % len(envs)]
            kind = op[0]
            if kind == "snapshot":
                snap = node.snapshot(env)
                lineage[env] = [*lineage[env], (snap.snapshot_id, dict(envs[env]))]
            elif kind == "fork":
                snap = node.snapshot(env)
                lineage[env] = [*lineage[env], (snap.snapshot_id, dict(envs[env]))]
                child = node.create(node.snaps.get(snap.snapshot_id))
                envs[child], lineage[child] = dict(envs[env]), list(lineage[env])
            elif kind == "rollback" and lineage[env]:
                at = op[1] % len(lineage[env])
                sid, state = lineage[env][at]
                node.snaps.rollback(node.manager, env, "t", sid)
                envs[env] = dict(state)
                # the env now descends from its target only: a later snapshot of the old
                # line is no ancestor, and rolling "forward" to it is refused (README: 422)
                lineage[env] = lineage[env][: at + 1]
            else:
                apply(node, env, envs[env], op, step)
        for env, model in sorted(envs.items()):
            assert node.sh(env, LIST) == view(model), (env, sequence)
    finally:
        node.close()
        for record in reversed(node.snaps.store.list()):
            node.snaps.store.remove(record.snapshot_id)
