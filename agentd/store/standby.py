"""Members stand by for the store's host, with torchrun's command line: one
``--rdzv-endpoint host:port`` and no list to maintain.

The agent that serves the store at the endpoint (the *seed*) does so as candidate 0 of a
**growing** candidate list, under term 1 (see :mod:`agentd.store.candidates`). Every other
agent starts a candidate server of its own before its first round (:meth:`Standby.prepare`:
on its own address, the seed's port if it is free there, else any port), whose endpoint
goes into its round entries, and once in a round offers it to the serving candidate
(``stand``), which appends it to the list, up to
:data:`~agentd.store.candidates.MAX_CANDIDATES`. Every answer says how long the list is,
so each client fetches a new version once. From then on a lost store host is failed over
as with a given list: the clients promote the first candidate that answers, under a new
term, and the round re-forms there.

A member whose offer went unanswered offers again after its next round; one the full
list refused, or that never heard, keeps its server listening: it answers the other
members' questions with its client's list, which is how a member that knows the seed
alone finds the job after the host was lost (the peers of :mod:`agentd.store.failover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agentd.exceptions import ConfigError, StartError
from agentd.store import token_file
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
    other candidates (the protocol simulation's own). ``keeps_token``: the job's token is
    the one its loopback seed published, and we keep a copy of it while we stand by (see
    :mod:`agentd.store.token_file`)."""

    def __init__(
        self,
        client: FailoverStore,
        host: str,
        max_connections: int,
        prober: Callable[..., Prober] = Prober,
        keeps_token: bool = False,
    ) -> None:
        self._client = client
        self._keeps_token = keeps_token
        self._token_copy: tuple[Path, str] | None = None
        self._prober = prober
        self._host = host
        self._max_connections = max_connections
        self._prepared = False
        self._offered = False
        """Admitted to the list, or refused by a full one: nothing more to offer."""
        self._task: asyncio.Task[None] | None = None
        self.server: StoreServer | None = None

    @property
    def serving(self) -> bool:
        """Our candidate serves the store now (the seed's host was lost)."""
        candidacy = self.server.candidacy if self.server is not None else None
        return candidacy is not None and candidacy.serving

    @property
    def endpoint(self) -> str:
        """Where our candidate server listens ('' where none does)."""
        candidacy = self.server.candidacy if self.server is not None else None
        return candidacy.own if candidacy is not None else ""

    async def prepare(self) -> str:
        """Listen, standing by, before this agent's first round (once): our endpoint ('' if
        we cannot stand by), for our round entries. Called once the seed has answered: its
        answers say whether it keeps a list, and give the token on loopback."""
        if not self._prepared:
            self._prepared = True
            await self._listen_for(self._client)
            self.start_soon()  # offered now, its answer comes as the round forms
        return self.endpoint

    def after_round(self, peers: Sequence[str]) -> None:
        """A round formed: ``peers`` (where its other members stand by) are our client's
        peers now, and we offer our candidate if it was neither admitted nor refused."""
        self._client.peers = tuple(peers)
        self.start_soon()

    def start_soon(self) -> None:
        """Offer our candidate to the serving one, in the background, unless it was
        admitted or refused (called after each round: by then the seed has answered, so
        its list and our token are known)."""
        if self._offered or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._stand_by(), name="store-standby")

    async def _listen_for(self, client: FailoverStore) -> None:
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
        if self._keeps_token:
            with contextlib.suppress(OSError, StartError):  # a restarted seed makes a new one
                self._token_copy = token_file.keep_copy(seed_port, token), token
        candidacy.extend(client.endpoints, client.list_term)
        candidacy.observe(client.term)
        client.on_list = self._follow
        client.own_candidate = candidacy.own

    def _follow(self, endpoints: tuple[str, ...], term: int) -> None:
        """Our client took ``endpoints`` (served under ``term``) as its list: so does our
        candidate; and where it is the job's list in place of a fork a restarted store
        host served, which had admitted us, we offer our candidate again."""
        candidacy = self.server.candidacy if self.server is not None else None
        if candidacy is None:
            return
        candidacy.extend(endpoints, term)
        if self._offered and candidacy.own not in endpoints and len(endpoints) < MAX_CANDIDATES:
            log.info(
                "Store: %s is not among the candidates %s: offering it again",
                candidacy.own,
                ",".join(endpoints),
            )
            self._offered = False
            self.start_soon()

    async def _stand_by(self) -> None:
        if not self._prepared:
            await self.prepare()
        if self.server is None:
            self._offered = True  # we cannot stand by: nothing to offer
            return
        candidacy = self.server.candidacy
        assert candidacy is not None
        try:
            answer = await self._client.stand(candidacy.own)
        except StoreError as exc:
            log.warning(
                "Store: cannot stand by for %s (%s); offering again after the next round",
                self._client.endpoints[0],
                exc,
            )
            return
        self._offered = True
        candidacy.observe(self._client.term)  # asked for its role, we say the serving term
        if not answer.get("admitted"):
            log.debug("Store: the candidate list is full; %s answers peers only", candidacy.own)
            return
        log.info(
            "Standing by as store candidate %d on %s: if %s is lost, this agent can "
            "serve the store",
            candidacy.index,
            candidacy.own,
            self._client.endpoints[0],
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

    async def leave(self) -> None:
        """This agent leaves: stop standing by, so that no client promotes a candidate
        whose agent is about to go, unless ours serves the store now (its hand-over stops
        it where the others can move on). Three of five agents stopped at once, the
        store's host among them: the host handed the store to a leaving one, the leavers
        counted themselves gone in stores of their own, and the two left re-formed only
        after the fence of the store they moved to (20 s)."""
        if not self.serving:
            await self.close()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self._token_copy is not None:
            token_file.drop_copy(*self._token_copy)
            self._token_copy = None
