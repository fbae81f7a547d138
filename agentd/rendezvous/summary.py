"""A sealed round, as every member reads it: one small value, whatever the round's size.

The agent that seals a round reads the members' node entries once and writes this summary
as the round's ``sealed`` value, so the other members get it in the watch event that tells
them the round is sealed, and none of them reads N entries (N members each reading N
entries was the rendezvous's O(N²)). Its size grows with the number of *distinct* nodes,
not with their count: consecutive members with the same role, worker count and kept
workers are one group. It holds what rank assignment needs (roles and worker counts by
group rank, the workers each node kept), the master's address, and why members of the
previous round are missing (their exclusions), and where the first members that stand by
for the store listen (at most :data:`PEERS`: a member that lost the store's candidate
list asks them for it; see :mod:`agentd.store.failover`).

Format (JSON)::

    {"size": n, "master": [addr, port],
     "groups": [[role, nproc, [kept local ranks], count], ...],
     "excluded": {node id: exclusion document},          # absent when empty
     "peers": [host:port, ...]}                          # absent when empty

"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar, overload

from agentd.rendezvous.api import RendezvousStateError, RoleInstanceInfo

T = TypeVar("T")

PEERS = 8
"""The most members' candidate endpoints a summary names, in their order of arrival."""


class Group(NamedTuple):
    """``members`` consecutive members with the same role, worker count and kept ranks."""

    role: str
    nproc: int
    kept: tuple[int, ...]
    members: int


class RoundSummary(NamedTuple):
    """A sealed round of ``size`` members (see the module docstring)."""

    size: int
    master_addr: str
    master_port: int
    groups: tuple[Group, ...]
    excluded: Mapping[str, dict[str, Any]]
    peers: tuple[str, ...] = ()
    """Where the first members that stand by for the store listen (their ``candidate``)."""

    def role_infos(self) -> Sequence[RoleInstanceInfo]:
        """Every member's role info, by group rank (built on access, not stored)."""
        return _ByRank(self.groups, lambda g, rank: RoleInstanceInfo(g.role, rank, g.nproc))

    def kept(self) -> Sequence[tuple[int, ...]]:
        """Every member's kept local ranks, by group rank (empty: nobody kept any)."""
        if not any(g.kept for g in self.groups):
            return ()
        return _ByRank(self.groups, lambda g, _rank: g.kept)


def summarize(
    nodes: Sequence[Mapping[str, Any]], excluded: Mapping[str, dict[str, Any]]
) -> RoundSummary:
    """The summary of a round whose members' entries are ``nodes``, by arrival."""
    if not nodes:
        raise ValueError("a sealed round has at least one member")
    keyed = (
        (str(n["role"]), int(n["nproc"]), tuple(int(r) for r in n.get("kept", ()))) for n in nodes
    )
    groups = tuple(
        Group(role, nproc, kept, sum(1 for _ in run))
        for (role, nproc, kept), run in itertools.groupby(keyed)
    )
    master = nodes[0]
    peers = tuple(str(n["candidate"]) for n in nodes if n.get("candidate"))[:PEERS]
    return RoundSummary(
        len(nodes), str(master["addr"]), int(master["port"]), groups, dict(excluded), peers
    )


def encode(summary: RoundSummary) -> bytes:
    doc: dict[str, Any] = {
        "size": summary.size,
        "master": [summary.master_addr, summary.master_port],
        "groups": [[g.role, g.nproc, list(g.kept), g.members] for g in summary.groups],
    }
    if summary.excluded:
        doc["excluded"] = summary.excluded
    if summary.peers:
        doc["peers"] = list(summary.peers)
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(raw: bytes) -> RoundSummary:
    """The summary in a ``sealed`` value; :class:`RendezvousStateError` names what is wrong
    (an agent of another agentd version sealed the round, or the store is corrupt)."""
    try:
        doc = json.loads(raw)
        addr, port = doc["master"]
        groups = tuple(
            Group(str(role), int(nproc), tuple(int(r) for r in kept), int(count))
            for role, nproc, kept, count in doc["groups"]
        )
        summary = RoundSummary(
            int(doc["size"]),
            str(addr),
            int(port),
            groups,
            dict(doc.get("excluded", {})),
            tuple(str(peer) for peer in doc.get("peers", ())[:PEERS]),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise RendezvousStateError(
            f"the round's sealed value {raw[:80]!r} is not a round summary ({exc}); do all "
            "agents of the job run the same agentd version?"
        ) from None
    if summary.size < 1 or sum(g.members for g in groups) != summary.size:
        raise RendezvousStateError(
            f"the round's sealed value {raw[:80]!r}: its groups do not add up to its size"
        )
    return summary


class _ByRank(Sequence[T]):
    """A per-member value for each group rank, computed from the groups on access."""

    def __init__(self, groups: Sequence[Group], value: Any) -> None:
        self._groups = groups
        self._starts = list(itertools.accumulate((g.members for g in groups), initial=0))
        self._value = value

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        group = bisect.bisect_right(self._starts, index) - 1
        return self._value(self._groups[group], index)

    def __eq__(self, other: object) -> bool:  # as tuples and lists compare
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def __iter__(self) -> Iterator[T]:
        rank = 0
        for group in self._groups:
            for _ in range(group.members):
                yield self._value(group, rank)
                rank += 1
