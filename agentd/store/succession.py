"""A serving candidate hands its store, state and all, to a successor of its choosing.

A failover starts the new server empty: the others' round goes with the old state, and
their workers are stopped. That is the price of losing a store's host, but it was also
paid where the host had nothing left to do: its workers done, it waited in its exit
barrier while another node's worker still worked (rank 0's final save), and a SIGKILL,
a host lost or a freeze there took the store along. So the host hands the store down
while it is alive (:func:`hand_down`, called from the exit barrier):

1. it asks the candidates it would rather see serve (those of the members still at work,
   in that order) their role, and picks the first standing by;
2. it holds every request that could change its state (:meth:`StoreServer.holding`):
   they wait, and a request already under way has been carried out or not begun (a write
   never waits on the loop once it is past the serving check);
3. it sends that candidate its state (every live key, its value and the seconds its TTL
   has left: :meth:`~agentd.store.memory.MemoryStore.snapshot`) with ``inherit``, under
   the next term: the candidate is promoted and writes the state into its fresh store
   in one step, before it answers anyone;
4. told so, it steps down, and the held requests answer "not serving": their clients
   fail over as after any loss, find the successor serving under the newest term, and
   read the same keys there. Refused (the candidate was promoted under that term by
   someone else, or is cut off) or never sent, it serves on. No answer: it asks the
   candidate's role once more; refused then (its process is gone: it serves nothing), or
   standing by under an older term, it serves on; else it steps down all the same (two
   servers serving on would be two stores; the clients' failover then finds the
   successor, or promotes one, empty, as before).

A key lives on at the successor for the seconds it had left when the state was taken,
plus the time the request took: a lease never ends earlier than it would have.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentd.store.ops import encode_items
from agentd.store.wire import INHERIT_MAX_BODY
from agentd.support.collector import collector_paused

if TYPE_CHECKING:
    from agentd.store.server import StoreServer

log = logging.getLogger(__name__)


async def hand_down(server: StoreServer | None, prefer: Sequence[str]) -> str:
    """Hand the store ``server`` serves to the first of the candidates ``prefer`` (endpoints
    of our list) that stands by and takes it (see the module docstring); the one that did
    ('' where none did, and we serve on; or where the outcome is unknown, and we stepped
    down)."""
    candidacy = server.candidacy if server is not None else None
    if server is None or candidacy is None or not candidacy.serving:
        return ""
    wanted = [e for e in dict.fromkeys(prefer) if e in candidacy.endpoints and e != candidacy.own]
    for endpoint in wanted:
        report = await candidacy.ask(endpoint, "role", {})
        if not candidacy.serving:
            return ""  # stepped down meanwhile: the store is not ours to hand
        if not report.reachable or report.serving:
            continue
        term = candidacy.term + 1
        listed = {"endpoints": list(candidacy.endpoints), "list_term": candidacy.list_term}
        with server.holding(), collector_paused():
            held = time.monotonic()
            items = server.store.snapshot()
            size = sum(len(key) + (len(value) + 2) // 3 * 4 + 32 for key, value, _ in items)
            if size > INHERIT_MAX_BODY:  # (its keys are ASCII, its values sent in base64)
                said = "Store %s: its state, %d keys (%.1f MiB), is more than a successor may "
                said += "be sent (%.1f MiB): it serves on"
                log.info(said, candidacy.own, len(items), size / 2**20, INHERIT_MAX_BODY / 2**20)
                return ""
            body = {"term": term, **(listed if candidacy.growing else {})}
            body["items"] = encode_items(items)
            answer = await candidacy.ask(endpoint, "inherit", body)
            unsure = answer.unsure
            if unsure:  # (refused now: its process is gone, and it serves nothing)
                answer = await candidacy.ask(endpoint, "role", {})
                unsure = not answer.refused
            if answer.inherited and answer.term == term:
                if candidacy.serving:  # (its first words to us may have said so already)
                    candidacy.step_down(f"handed the store to {endpoint}", logging.DEBUG)
                candidacy.observe(term)
                said = "Store %s: handed the store, its %d keys, to %s (term %d), holding "
                said += "requests for %.1f ms"
                ms = (time.monotonic() - held) * 1000
                log.info(said, candidacy.own, len(items), endpoint, term, ms)
                return endpoint
            if unsure and (not answer.reachable or answer.term >= term):
                if candidacy.serving:
                    candidacy.step_down(f"{endpoint} did not say whether it took the store over")
                return ""
        why = answer.problem or f"{answer.role} under term {answer.term}"
        log.info("Store %s: %s did not take the store over (%s)", candidacy.own, endpoint, why)
    return ""
