"""Why a rendezvous timed out without a round: the store out of reach, or too few nodes."""

from __future__ import annotations

import asyncio
from typing import Any

from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.rounds import Rounds
from agentd.store.api import StoreError


async def no_round_message(
    run_id: str,
    settings: RendezvousSettings,
    rounds: Rounds,
    store_problem: str,
    store_status: dict[str, Any] | None,
) -> str:
    """One line: the store's problem (``store_problem``, the last one seen while joining;
    else one more count of the joined nodes, within 2 s, says whether there is one), or
    how many nodes joined, against the ``min..max`` the round needed."""
    window = (
        f"{settings.min_nodes}..{settings.max_nodes} needed, within "
        f"join_timeout={settings.join_timeout:g}s"
    )
    problem = store_problem
    joined = 0
    if not problem:
        try:
            async with asyncio.timeout(2):
                joined = await rounds.joined()
        except (StoreError, TimeoutError) as exc:  # a search for a candidate goes on: name all
            from agentd.store.candidates import none_serving

            problem = str(exc) or none_serving(store_status) or "it did not answer within 2s"
    if problem:
        return (
            f"rendezvous {run_id!r}: the store could not be reached "
            f"({problem}); no round of {window}"
        )
    return f"rendezvous {run_id!r}: {joined} node(s) joined, {window}"
