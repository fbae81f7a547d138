"""What became of the round a member waits on in its exit barrier, and of the rounds after it.

Read every :data:`~agentd.rendezvous.exit_barrier.CHECK` seconds (one request, two once the
round ended): a member whose workers succeeded waits for every other member's ``done`` key,
and leaves early, with a WARNING, once nobody is left who could write one or finish the
job and close the run in a later round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from agentd.rendezvous import accounting, summary
from agentd.rendezvous.api import RendezvousStateError

if TYPE_CHECKING:
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
    round ended, and the same holds for the last round sealed after it (see
    :func:`later_round_left`)."""
    unaccounted: bool
    """Some member is neither gone nor done, nobody arrived at the next round (whose first
    member would count the lapsed ones gone), and the store holds the round: the leases
    of the members still at work are worth a look (:mod:`~agentd.rendezvous.barrier_leases`)."""
    later: int | None = None
    """The later round that nobody is left in, where that is what ``nobody_left`` says."""


async def round_state(store: Store, keys: RunKeys, gen: int, size: int) -> RoundState:
    """What became of round ``gen`` (of ``size`` members) while a member of it waits."""
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
        nobody_left=left > 0 and accounted >= size and joined is None,
        unaccounted=accounted < size and joined is None and sealed is not None,
    )
    if state.ended and not state.nobody_left:
        later = await later_round_left(store, keys, [g for g in (current - 1, current) if g > gen])
        if later is not None:
            return state._replace(nobody_left=True, later=later)
    return state


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
        if sealed is None or joined is not None:
            continue
        try:
            size = summary.decode(sealed).size
        except RendezvousStateError:
            continue  # ended before it was sealed (its marker is no summary)
        left = int(gone or b"0")
        if left > 0 and left + int(finished or b"0") >= size:
            return gen
    return None
