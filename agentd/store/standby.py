"""Members stand by for the store's host, with torchrun's command line: one
``--rdzv-endpoint host:port`` and no list to maintain.

The agent that serves the store at the endpoint (the *seed*) does so as candidate 0 of a
**growing** candidate list, under term 1 (see :mod:`agentd.store.candidates`). Every other
agent, once it has been in a round, starts a candidate server of its own that stands by
(on its own address: the seed's port if it is free there, else any port) and offers it to
the serving candidate (``stand``), which appends it to the list, up to
:data:`~agentd.store.candidates.MAX_CANDIDATES`. Every answer says how long the list is,
so each client fetches a new version once. From then on a lost store host is failed over
as with a given list: the clients promote the first candidate that answers, under a new
term, and the round re-forms there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentd.exceptions import ConfigError, StartError
from agentd.store.api import StoreError
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import MAX_CANDIDATES, Prober
from agentd.store.failover import FailoverStore
from agentd.support.aio import cancel_and_wait
from agentd.support.net import endpoint_text, route_source, split_endpoint

if TYPE_CHECKING:
    from agentd.store.server import StoreServer

log = logging.getLogger(__name__)


class Standby:
    """This agent's offer to serve the store of ``client``'s growing list if its host is
    lost: a candidate server on ``host`` ('': the address we reach the seed from),
    preferably on the seed's port, taking at most ``max_connections``; ``prober`` asks the
    other candidates (the protocol simulation's own)."""

    def __init__(
        self,
        client: FailoverStore,
        host: str,
        max_connections: int,
        prober: Callable[..., Prober] = Prober,
    ) -> None:
        self._client = client
        self._prober = prober
        self._host = host
        self._max_connections = max_connections
        self._task: asyncio.Task[None] | None = None
        self.server: StoreServer | None = None

    @property
    def serving(self) -> bool:
        """Our candidate serves the store now (the seed's host was lost)."""
        candidacy = self.server.candidacy if self.server is not None else None
        return candidacy is not None and candidacy.serving

    def start_soon(self) -> None:
        """Stand by, in the background, if not done yet (called after each round: by then
        the seed has answered, so its list and our token are known)."""
        if self._task is None:
            self._task = asyncio.create_task(self._stand_by(), name="store-standby")

    async def _stand_by(self) -> None:
        client = self._client
        token = client.token
        if (client.alone and client.candidate_count == 0) or not token:
            return  # the seed keeps no list (`agentd store`, or one started without a port)
        if len(client.endpoints) >= MAX_CANDIDATES or client.candidate_count >= MAX_CANDIDATES:
            return
        seed_host, seed_port = split_endpoint(client.endpoints[0])
        host: str | None = self._host
        if not host:
            host = await asyncio.to_thread(route_source, seed_host, seed_port)
        if not host:
            log.warning("Store: cannot stand by for %s: no route to it", client.endpoints[0])
            return
        candidacy = Candidacy(
            client.endpoints[:1], None, token, growing=True, tls=client.tls, prober=self._prober
        )
        server = self.server = await self._listen(host, seed_port, candidacy, token)
        if server is None:
            return
        candidacy.extend(client.endpoints)
        client.on_list = candidacy.extend
        client.own_candidate = candidacy.own
        try:
            answer = await client.stand(candidacy.own)
        except StoreError as exc:
            log.warning("Store: cannot stand by for %s (%s)", client.endpoints[0], exc)
            answer = {}
        if not answer.get("admitted"):
            client.on_list = None
            client.own_candidate = ""
            self.server = None
            await server.stop()
            return
        log.info(
            "Standing by as store candidate %d on %s: if %s is lost, this agent can "
            "serve the store",
            candidacy.index,
            candidacy.own,
            client.endpoints[0],
        )

    async def _listen(
        self, host: str, port: int, candidacy: Candidacy, token: str
    ) -> StoreServer | None:
        from agentd.store.server import StoreServer  # aiohttp's server: once standing by

        for each in dict.fromkeys((port, 0)):
            server = StoreServer(
                host,
                each,
                token,
                candidacy=candidacy,
                max_connections=self._max_connections,
                tls=self._client.tls,
            )
            try:
                await server.start()
            except ConfigError as exc:  # no port would do (TLS without a certificate)
                log.warning("Store: cannot stand by for %s: %s", self._client.endpoints[0], exc)
                return None
            except StartError as exc:
                log.debug("Store standby: cannot listen on %s:%d (%s)", host, each, exc)
                continue
            candidacy.own = endpoint_text(host, server.port)
            return server
        log.warning(
            "Store: cannot stand by for %s: no port to listen on at %s",
            self._client.endpoints[0],
            host,
        )
        return None

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self.server is not None:
            await self.server.stop()
            self.server = None
