"""Which global ranks kept their process into a round, as every node computes them."""

from agentd.agent.rendezvous_steps import assign_worker_ranks, kept_global_ranks
from agentd.rendezvous.api import RoleInstanceInfo
from agentd.spec import WorkerSpec


def test_kept_local_ranks_become_the_global_ranks_each_node_assigns():
    infos = [
        RoleInstanceInfo("trainer", 0, 2),
        RoleInstanceInfo("trainer", 1, 3),
        RoleInstanceInfo("trainer", 2, 2),
    ]
    kept = [(1,), (), (0, 1)]
    assert kept_global_ranks(infos, kept) == {1, 5, 6}
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint="x.py")
    third = assign_worker_ranks(infos, 2, spec)  # what the third node's own workers get
    assert {w.global_rank for w in third if w.local_rank in kept[2]} == {5, 6}


def test_role_infos_in_any_order_and_nothing_kept():
    infos = [RoleInstanceInfo("a", 1, 4), RoleInstanceInfo("a", 0, 4)]
    assert kept_global_ranks(infos, [(3,), (0,)]) == {3, 4}
    assert kept_global_ranks(infos, [(), ()]) == frozenset()
