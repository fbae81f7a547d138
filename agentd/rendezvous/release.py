"""Releasing a killed agent's membership, so its peers go on in seconds, not a lease later.

While an agent is a member of a round, it hands its guardian a *will*
(:func:`will`): how to reach the store as a client, and which node of which round it is.
An agent SIGKILLed (or dead of any other cause) leaves its guardian behind, which kills
its workers first and only then runs ``python -m agentd.rendezvous.release`` with the
will on its stdin. Fencing holds: no worker of the dead agent is alive when its ranks are
given to others. The release then, as a graceful leave would:

1. marks the node gone for good (:mod:`agentd.rendezvous.accounting`) and seals the round
   its peers are joining if that completes its count;
2. deletes the node's heartbeat, which its peers watch: they end their round and rejoin.

There is no will while the agent is between rounds (it may have counted itself back in
the next one), or after it left cleanly. An agent that serves the store has one once
another candidate stands by to serve it (the will names every candidate: renewed the
moment the store it serves admits one, and with each heartbeat): its release then reaches
the candidate that took the store over, and marks it gone in the new store. A lost host,
whose guardian went with it, still waits for its lease. On etcd the will names the
cluster (its members, key prefix, TLS files and credentials): a SIGKILLed agent there
waited for its lease too before 2026-12-02.

The will names the server instance that held the round. A release that reaches another
(the store restarted or failed over since) asks every candidate for one serving under a
newer term than the one it reached, and releases there too: a new node started at once
at a killed host's endpoint serves a fresh store under term 1, which took the mark and
dropped it on stepping down to the job's candidate, whose round then waited for the
forgotten round's fence (20 s, ``bench/bench_seed_back.py --new-host``, 2 runs of 57).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from agentd.rendezvous.accounting import Carried
from agentd.rendezvous.keys import RunKeys
from agentd.rendezvous.round import RoundSettings
from agentd.rendezvous.rounds import Rounds
from agentd.rendezvous.seal_wait import instance_of

if TYPE_CHECKING:
    from agentd.rendezvous.round import Round
    from agentd.store.api import Store
    from agentd.store.connect import OpenedStore

TIMEOUT = 10.0
"""How long a release tries to reach the store."""


def will(
    run_id: str,
    node: str,
    opened: OpenedStore | None,
    rounds: Rounds | None,
    current: Round | None,
) -> dict[str, Any] | None:
    """The will of node ``node`` while a member of ``current`` (None when there is none:
    an agent that serves the store needs another candidate to serve it after its death)."""
    if opened is None or rounds is None or current is None or opened.client_spec is None:
        return None
    store = opened.client_spec()
    if opened.serves and len(store["endpoints"]) < 2:
        return None
    return {
        "run_id": run_id,
        "node": node,
        "round": [current.generation, current.size],
        "limits": list(rounds.settings),
        "store": store,
        "instance": instance_of(opened.store),
        "path": [entry for entry in sys.path if entry],
    }


async def release(doc: dict[str, Any], store: Store | None = None) -> str:
    """Carry out the will ``doc``; what was done, in one line. It reaches the store its
    ``store`` spec names, or ``store`` where given (the protocol simulation's)."""
    run_id, node = str(doc["run_id"]), str(doc["node"])
    generation = int(doc["round"][0])
    own = store is None
    if store is None:
        store = _client(doc["store"])
    try:
        async with asyncio.timeout(TIMEOUT):
            await _release_in(store, doc)
            held = doc.get("instance")
            if own and isinstance(held, str) and instance_of(store) not in (None, held):
                await _release_at_newer(doc, getattr(store, "term", 0))
    finally:
        if own:
            await store.close()
    return f"released node {node}'s membership of round {generation} of run {run_id!r}"


def _client(spec: dict[str, Any]) -> Store:
    """A client of the store the will's ``spec`` describes: etcd's, or agentd's own."""
    if spec.get("kind") == "etcd":
        from agentd.store.etcd.connect import etcd_client_from_spec

        return etcd_client_from_spec(spec, TIMEOUT)
    from agentd.store.client_spec import client_from_spec

    return client_from_spec(spec, TIMEOUT)


async def _release_in(store: Store, doc: dict[str, Any]) -> None:
    """Mark the will's node gone in ``store``, and delete its heartbeat there."""
    run_id, node = str(doc["run_id"]), str(doc["node"])
    generation, size = (int(n) for n in doc["round"])
    keys = RunKeys(run_id)
    rounds = Rounds(run_id, store, keys, RoundSettings(*doc["limits"]), None, {"node": node})
    rounds.carried = Carried(generation, size, member=True)
    await rounds.settle(node)
    await store.delete(keys.heartbeat(node))


async def _release_at_newer(doc: dict[str, Any], term: int) -> None:
    """The store reached forgot the round: release in a candidate serving under a term
    newer than ``term`` too, if one does."""
    from agentd.store.client_spec import client_from_spec, prober_from_spec

    prober = prober_from_spec(doc["store"])
    try:
        reports = await prober.roles(term)
    finally:
        await prober.close()
    newer = [r for r in reports if r.serving and r.term > term]
    if not newer:
        return
    newest = max(newer, key=lambda r: r.term)
    store = client_from_spec(
        {**doc["store"], "serving": newest.index, "term": newest.term}, TIMEOUT
    )
    try:
        await _release_in(store, doc)
    finally:
        await store.close()


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        doc = json.loads(sys.stdin.read())
        said = asyncio.run(release(doc))
    except Exception as exc:
        sys.stderr.write(f"agentd guardian: could not release the membership: {exc!r}\n")
        return 1
    sys.stderr.write(f"agentd guardian: the agent died; {said}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
