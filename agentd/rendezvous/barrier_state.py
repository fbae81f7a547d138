"""What became of the round a member waits on in its exit barrier, and of the rounds after it.

Read every :data:`~agentd.rendezvous.exit_barrier.CHECK` seconds (one request, two once the
round ended): a member whose workers succeeded waits for every other member's ``done`` key,
and leaves early, with a WARNING, once nobody is left who could write one or finish the
job and close the run in a later round.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

from agentd.rendezvous import accounting, summary
from agentd.rendezvous.api import RendezvousStateError

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentd.rendezvous.keys import RunKeys
    from agentd.store.api import Store


class RoundState(NamedTuple):
    ended: bool
    """The generation moved past the round."""
    gone: int
    """Members of the round that left for good (a leave, or a guardian's release)."""
    nobody_left: bool
    """Every member is gone or done, and nobody arrived at the next round: no node will
    ever write the missing ``done`` keys, nor finish the job and close the run. Or the
    round ended, and the same holds for a round sealed after it
    (:func:`later_round_left`), or a round after it that was never sealed has only
    arrivals gone (:class:`Arrivals`)."""
    unaccounted: bool
    """Some member is neither gone nor done, nobody arrived at the next round (whose first
    member would count the lapsed ones gone), and the store holds the round (or forgot it,
    and the waiting member knows whom to look at): the leases of the members still at work
    are worth a look (:mod:`~agentd.rendezvous.barrier_leases`)."""
    later: int | None = None
    """The later round that nobody is left in, where that is what ``nobody_left`` says."""


async def round_state(
    store: Store,
    keys: RunKeys,
    gen: int,
    size: int,
    arrivals: Arrivals | None = None,
    forgotten: bool = False,
    unseen_lost: bool = False,
) -> RoundState:
    """What became of round ``gen`` (of ``size`` members) while a member of it waits
    (``arrivals``: the look at a later round's arrivals, kept between reads;
    ``forgotten``: in a store that forgot the round, where the waiting one looks at the
    successors whose ids it read before; ``unseen_lost``: it forgot it long enough ago
    that a member neither done, gone nor back at a later round is at work no more,
    :meth:`~agentd.rendezvous.barrier_leases.SuccessorLeases.unseen_are_lost`)."""
    now, gone, finished, joined, sealed = await store.multi_get(
        [
            keys.gen,
            keys.round(gen, accounting.MEMBERS),
            keys.round(gen, accounting.FINISHED),
            keys.round(gen + 1, "join"),
            keys.round(gen, "sealed"),
        ]
    )
    left = int(gone or b"0")
    accounted = left + int(finished or b"0")
    current = int(now) if now is not None and now.isdigit() else gen
    state = RoundState(
        ended=current > gen,
        gone=left,
        nobody_left=joined is None and ((left > 0 and accounted >= size) or unseen_lost),
        unaccounted=accounted < size and joined is None and (sealed is not None or forgotten),
    )
    if state.ended and not state.nobody_left:
        later = await later_round_left(store, keys, [g for g in (current - 1, current) if g > gen])
        if later is not None:
            return state._replace(nobody_left=True, later=later)
        everyone = size if unseen_lost else accounted  # the unseen: lost
        if arrivals is not None and await arrivals.all_gone(gen, size, current, everyone):
            return state._replace(nobody_left=True, later=current)
    return state


def nobody_left_because(state: RoundState, gen: int, unseen_lost: bool) -> str:
    """Why nobody is left to finish round ``gen`` where ``state`` says so (a clause)."""
    if state.later is not None:
        return (
            f"round {gen} ended, the others went on to round {state.later} and left it or "
            "were lost there before their workers finished"
        )
    if unseen_lost and state.gone == 0:
        return (
            f"the store forgot round {gen} and no other member came back to it within a "
            "heartbeat TTL (lost, or cut off past its lease)"
        )
    return (
        f"{state.gone} node(s) of round {gen} left or were lost before their workers "
        "finished, every other one's are done, and no node is at the next round"
    )


async def later_round_left(store: Store, keys: RunKeys, rounds: list[int]) -> int | None:
    """The one of ``rounds`` (sealed after the round a member waits on) that has every
    member gone or done (one gone at least) while nobody arrived at the round after it,
    if one has: the members of the round before re-formed without the waiting one, then
    left too (a worker's failure, then a preemption; a store restarted empty, then a
    stop), and waiting on could only end at the barrier timeout."""
    if not rounds:
        return None
    got = await store.multi_get(
        [
            key
            for g in rounds
            for key in (
                keys.round(g, "sealed"),
                keys.round(g, accounting.MEMBERS),
                keys.round(g, accounting.FINISHED),
                keys.round(g + 1, "join"),
            )
        ]
    )
    for index, gen in enumerate(rounds):
        sealed, gone, finished, joined = got[4 * index : 4 * index + 4]
        size = _sealed_size(sealed)
        if size is None or joined is not None:
            continue
        left = int(gone or b"0")
        if left > 0 and left + int(finished or b"0") >= size:
            return gen
    return None


ARRIVALS_READ = 64
"""Arrivals whose entries one read names (a look stops at the first one alive)."""


class Arrivals:
    """The arrivals at the rounds after ours that the others re-formed in and that were
    never sealed (the one the generation names, and the one before it where that ended
    unsealed): they wait there for more nodes (a job of a fixed size, and this node done),
    and each one's heartbeat, announced as it joined, is renewed while it waits, from one
    round to the next. Once every one of them has had none for ``fence`` seconds (a
    heartbeat TTL: a lease lapsed, or deleted as it left), and every member of our round
    is done, gone, or back at one of those rounds, nobody can finish the job. Seeds of
    ``bench/simulate.py --kinds ...,restart_store`` where a store restarted empty, the
    one member at work back at a next round that only this node's return could fill:
    4113, killed there; 8554, SIGTERMed there, which ended that round unsealed and left
    the next one empty. An arrival whose entry is not written yet, or whose heartbeat is
    there, is alive."""

    def __init__(self, store: Store, keys: RunKeys, fence: float, clock: Callable[[], float]):
        self._store, self._keys, self._fence, self._clock = store, keys, fence, clock
        self._missing_since: dict[str, float] = {}

    async def all_gone(self, ours: int, size: int, gen: int, accounted: int) -> bool:
        """Whether the arrivals after round ``ours`` (of ``size``) are all gone, where the
        generation names round ``gen`` and ``accounted`` members of ours are gone or done
        (see the class docstring)."""
        keys = self._keys
        rounds = [g for g in (gen - 1, gen) if g > ours]
        got = await self._store.multi_get(
            [keys.round(g, key) for g in rounds for key in ("join", "sealed", f"back/{ours}")]
        )
        counts, back = [], 0
        for index, g in enumerate(rounds):
            joined, sealed, came_back = got[3 * index : 3 * index + 3]
            if _sealed_size(sealed) is not None:
                if g == gen:
                    return False  # sealed: the round's own members are judged
                continue
            counts.append((g, int(joined or b"0")))
            back = max(back, int(came_back or b"0"))  # (one node may be back at both)
        if sum(count for _, count in counts) == 0 or accounted + back < size:
            return False
        for g, count in counts:
            if not await self._arrivals_gone(g, count):
                return False
        return True

    async def _arrivals_gone(self, gen: int, count: int) -> bool:
        """Whether each of round ``gen``'s ``count`` arrivals has had no heartbeat for
        ``fence`` seconds (the look stops at the first one alive)."""
        store, keys = self._store, self._keys
        now, fence = self._clock(), self._fence
        for start in range(0, count, ARRIVALS_READ):
            places = range(start, min(count, start + ARRIVALS_READ))
            named = await store.multi_get(
                [keys.round(gen, f"{kind}/{i}") for i in places for kind in ("node", "spare")]
            )
            nodes = [
                _node_of(entry, spare) for entry, spare in zip(named[::2], named[1::2], strict=True)
            ]
            if any(node is None for node in nodes):
                return False  # one joining still: alive
            beats = await store.multi_get([keys.heartbeat(str(node)) for node in nodes])
            for node, beat in zip(nodes, beats, strict=True):
                if beat is not None:
                    self._missing_since.pop(str(node), None)
                    return False
                self._missing_since.setdefault(str(node), now)
            if any(now - self._missing_since[str(node)] < fence for node in nodes):
                return False
        return True


def _sealed_size(sealed: bytes | None) -> int | None:
    """The size of a round whose ``sealed`` marker is its summary; None where it has no
    marker, or ended before it was sealed (its marker is no summary)."""
    if sealed is None:
        return None
    try:
        return summary.decode(sealed).size
    except RendezvousStateError:
        return None


def _node_of(entry: bytes | None, spare: bytes | None) -> str | None:
    """The node id an arrival's place names: its entry, or its spare record."""
    if entry is not None:
        try:
            return str(json.loads(entry)["node"])
        except (ValueError, KeyError, TypeError):
            return None
    return spare.decode() if spare is not None else None
