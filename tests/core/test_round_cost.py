"""What keeps a scheduling round cheap stays exact (issue 28): the count of queued actions
with a deadline that lets a round skip the deadline passes, and the per-node env index a
round's queue walk skips untouched nodes by."""

from __future__ import annotations

from dataclasses import replace

from arl_tangram.core import preemption
from arl_tangram.core.events import ActionSubmitted
from arl_tangram.core.policies import cpu_round
from tests.core.builders import Driver, make_action, make_cluster, make_env


def test_queued_deadlines_counts_the_cpu_queues_actions_with_a_deadline() -> None:
    d = Driver.of("elastic", make_cluster(cores=1, numa=1))
    for i in range(3):
        d.add_ready_env(make_env(f"e{i}"))
    d.step([ActionSubmitted(make_action("busy", env="e0", t_ori_s=10.0))], now=0.0)
    assert d.state.queued_deadlines == 0 and not preemption.any_deadline(d.state.edit(0.0))
    soon = replace(make_action("soon", env="e1"), timeout_s=1.0, deadline_s=3.0)
    later = replace(make_action("later", env="e2"), timeout_s=1.0, deadline_s=60.0)
    d.step([ActionSubmitted(soon), ActionSubmitted(later)], now=0.0)
    assert d.state.queued_deadlines == 2 and preemption.any_deadline(d.state.edit(0.0))
    d.step(now=2.0)  # "soon" can no longer start in time: rejected, counted out
    assert "soon" not in d.state.queue_cpu and d.state.queued_deadlines == 1
    d.finish("busy", now=3.0)  # "later" starts on the freed core: counted out
    assert "later" in d.state.running and d.state.queued_deadlines == 0


def test_the_env_index_follows_placements_and_names_only_the_touched_nodes_envs() -> None:
    d = Driver.of("elastic", make_cluster(cpu_nodes=2, cores=4, numa=1))
    d.add_ready_env(make_env("a"))
    d.add_ready_env(make_env("b"))
    nodes = {env_id: env.node_id for env_id, env in d.state.envs.items()}
    assert set(nodes.values()) == {"cpu-0", "cpu-1"}  # spread: one env per node
    ed = d.state.edit(d.state.now_s)
    assert cpu_round._envs_on(ed, {nodes["a"]}) == {"a"}
    assert cpu_round._envs_on(ed, {"cpu-0", "cpu-1"}) == {"a", "b"}
    d.add_ready_env(make_env("c"))  # a new env table: the memo must not answer for it
    ed = d.state.edit(d.state.now_s)
    assert "c" in cpu_round._envs_on(ed, {d.state.envs["c"].node_id})
