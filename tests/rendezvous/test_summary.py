"""The round summary: what the sealer writes once and every member reads in one value."""

from __future__ import annotations

import pytest

from agentd.agent.rendezvous_steps import kept_global_ranks
from agentd.rendezvous.api import RendezvousStateError, RoleInstanceInfo
from agentd.rendezvous.summary import PEERS, decode, encode, summarize


def entry(node: str, role: str = "trainer", nproc: int = 8, kept=(), port: int = 0):
    doc = {"node": node, "role": role, "nproc": nproc, "addr": f"10.0.0.{node}", "port": port}
    return {**doc, "kept": list(kept)} if kept else doc


def test_a_homogeneous_round_of_4096_is_one_group_and_a_few_dozen_bytes():
    nodes = [entry(str(i), port=29500 if i == 0 else 0) for i in range(4096)]
    raw = encode(summarize(nodes, {}))
    assert len(raw) < 100, raw
    summary = decode(raw)
    assert (summary.size, summary.master_addr, summary.master_port) == (4096, "10.0.0.0", 29500)
    infos = summary.role_infos()
    assert len(infos) == 4096
    assert infos[4095] == RoleInstanceInfo("trainer", 4095, 8) == infos[-1]
    assert summary.kept() == ()


def test_groups_follow_arrival_order_and_read_as_the_entries_would():
    nodes = [
        entry("0", "reader", 1),
        entry("1", nproc=2),
        entry("2", nproc=2, kept=[0, 1]),
        entry("3", nproc=2, kept=[0, 1]),
        entry("4", nproc=2),
    ]
    summary = decode(encode(summarize(nodes, {})))
    assert len(summary.groups) == 4
    expected = tuple(RoleInstanceInfo(n["role"], i, n["nproc"]) for i, n in enumerate(nodes))
    assert summary.role_infos() == expected and list(summary.role_infos()) == list(expected)
    assert summary.role_infos()[1:3] == list(expected[1:3])
    assert summary.kept() == ((), (), (0, 1), (0, 1), ())
    # ranks 0..6 by node: 0 | 1 2 | 3 4 | 5 6 | 7 8; node 2 and 3 kept both of theirs
    assert kept_global_ranks(summary.role_infos(), summary.kept()) == {3, 4, 5, 6}


def test_exclusions_travel_with_the_summary():
    why = {"reason": "bad host: sick", "cooldown": 5}
    summary = decode(encode(summarize([entry("0")], {"n7": why})))
    assert summary.excluded == {"n7": why}


def test_the_first_members_that_stand_by_travel_with_the_summary_in_arrival_order():
    """Where members stand by for the store (their entries' ``candidate``), at most
    PEERS of them: a member that lost the store's list asks them for it."""
    nodes = [entry(str(i)) for i in range(20)]
    for i in (1, 3, *range(5, 20)):
        nodes[i]["candidate"] = f"10.0.0.{i}:29400"
    summary = decode(encode(summarize(nodes, {})))
    first = [1, 3, *range(5, 5 + PEERS - 2)]
    assert summary.peers == tuple(f"10.0.0.{i}:29400" for i in first)
    assert decode(encode(summarize([entry("0")], {}))).peers == ()  # none: no key at all
    assert b"peers" not in encode(summarize([entry("0")], {}))


@pytest.mark.parametrize(
    "raw",
    [
        b"3",
        b"{}",
        b'{"size": 2, "master": ["a", 1], "groups": [["t", 1, [], 1]]}',
        b"\xff",
        b'{"size": 1, "master": ["a", 1], "groups": [["t", 1, [], 1]], "peers": 5}',
    ],
)
def test_a_value_that_is_not_a_summary_is_named(raw):
    with pytest.raises(RendezvousStateError, match="sealed value"):
        decode(raw)
