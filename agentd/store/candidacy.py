"""One candidate store server's role: standing by, or serving under a term.

A candidate starts standing by (term 0); a client promotes it (``POST /v1/promote``) when
it finds no candidate serving (see :mod:`agentd.store.candidates`). It serves until it
steps down, which it does on evidence of a successor:

* a request carrying a higher term than its own (a client that moved on), or
* a candidate found serving under a higher term, or the same term at a lower index, which
  it looks for (every :data:`LOOK_EVERY` seconds for :data:`LOOK_FOR`) after a sign that
  it was cut off or frozen: a heartbeat key expired in its store, or its loop stood still.
* **cut off**: in a growing list of three or more, a serving candidate that no other
  candidate answered for ``CUT_OFF`` seconds, where two or more had answered lately,
  steps down and takes no promotion until one answers again (the rule, and why, in
  :mod:`agentd.store.contact`). A serving candidate of any list of three or more asks the
  others every :data:`CONTACT_EVERY` seconds: its answers tell the clients which are
  silent (:meth:`Candidacy.absent`), and an answer may show a successor.

Stepping down drops the state (a later promotion starts empty, unless ``inherit`` hands
it one: :mod:`agentd.store.succession`) and answers the long polls waiting on it at once.

In a growing list (see :mod:`agentd.store.standby`), the serving candidate admits members
that stand by, and one promoted after a failover tells every other candidate its term and
the list until each has heard it: the old host, restarted as a lone seed serving an empty
store, steps down and its agent follows the list to the job. A seed whose host kept the
list it served asks it at once (:meth:`Candidacy.recall`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentd.store.api import StoreNotServing
from agentd.store.candidates import MAX_CANDIDATES, CandidateMismatch, Prober, RoleReport
from agentd.store.contact import ContactLog
from agentd.support.aio import cancel_and_wait, first_done

if TYPE_CHECKING:
    from agentd.store.tls import StoreTls

log = logging.getLogger(__name__)

LOOK_EVERY = 2.0
LOOK_FOR = 300.0
"""After a sign of trouble, how long a serving candidate keeps looking for a successor."""
TELL_AGAIN = 30.0
"""How often a candidate that has heard the term is told again (it may have restarted)."""
CONTACT_EVERY = 1.0
"""How often a serving candidate of a list of three or more asks the others."""
STALL = 1.0
"""How much longer than its asks' timeout a round of asks must take to have stood still."""

T = TypeVar("T")


class Candidacy:
    """Candidate ``index`` of ``endpoints``, sharing ``token`` with the others.

    ``growing``: the list grows from its first endpoint (the seed); a member standing by
    is constructed with the seed alone and ``index`` None, and learns its place when the
    serving candidate admits it (:attr:`own` is its endpoint, set once it listens).
    ``prober`` makes the prober of the other candidates (the protocol simulation's own).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        index: int | None,
        token: str,
        *,
        growing: bool = False,
        tls: StoreTls | None = None,
        prober: Callable[..., Prober] = Prober,
    ) -> None:
        self.growing = growing
        self._prober = prober(endpoints, token, growing=growing, tls=tls)
        self.fingerprint = self._prober.fingerprint
        self.own = endpoints[index] if index is not None else ""
        self.role = "standby"
        self.term = 0
        self.on_promote: Callable[[], None] = lambda: None
        """Called as serving begins: the server makes a fresh, empty store."""
        self.on_step_down: Callable[[], Coroutine[Any, Any, None]] | None = None
        """Called as serving ends: the server lets its store go."""
        self.admitted: list[Callable[[], object]] = []
        """Each called when a member standing by was appended to the list we serve."""
        self._standing_by = asyncio.Event()
        self._standing_by.set()
        self._look_until = 0.0
        self._looking: asyncio.Task[None] | None = None
        self._telling: asyncio.Task[None] | None = None
        self._touching: asyncio.Task[None] | None = None
        self.contact = ContactLog()
        self._asked = asyncio.Event()
        """Set as each round of asks ends (a request waiting on stale contact wakes)."""
        self.cut_off = False
        """Stepped down for want of contact, and no other candidate has answered since."""
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._prober.endpoints

    @property
    def list_term(self) -> int:
        """The term our list was served under: ours while we serve."""
        return self._prober.list_term

    @property
    def index(self) -> int:
        """Our place in the list (-1: a member not admitted yet)."""
        return self.endpoints.index(self.own) if self.own in self.endpoints else -1

    def share_token(self, token: str) -> None:
        """The token of the server we belong to (one it made itself, on loopback)."""
        self._prober.token = token

    @property
    def serving(self) -> bool:
        return self.role == "serving"

    @property
    def asks_others(self) -> bool:
        """Serving, we ask the others every :data:`CONTACT_EVERY`: three or more of us."""
        return len(self.endpoints) >= 3

    @property
    def watches_contact(self) -> bool:
        """The cut-off rule applies: a growing list of three or more."""
        return self.growing and self.asks_others

    def document(self) -> dict[str, Any]:
        doc = {"role": self.role, "term": self.term, "index": self.index, "endpoint": self.own}
        doc["absent"] = [self.endpoints[i] for i in self.absent()]
        if self.growing:
            doc.update(self._prober.list_doc(), cut_off=self.cut_off)
        return doc

    def extend(self, endpoints: Sequence[str], term: int = 0) -> None:
        """Adopt ``endpoints``, served under ``term``, if it replaces our growing list
        (:func:`~agentd.store.candidates.replaces`); serving, only a later version of it,
        or merge a fork of it served under our term (:meth:`~.candidates.Prober.merge`)."""
        who = f"Store {self.own}"
        merged = self._prober.merge(endpoints, term, who) if self.growing and self.serving else []
        if self.growing and not self._joined(merged):
            self._prober.take(endpoints, term, who, grow_only=self.serving)

    def admit(self, endpoint: str) -> bool:
        """A member at ``endpoint`` stands by: append it to the list we serve (False: the
        list is full, or not ours to grow)."""
        if endpoint in self.endpoints:
            return True
        if not (self.growing and self.serving) or len(self.endpoints) >= MAX_CANDIDATES:
            return False
        self._prober.endpoints += (endpoint,)
        said = "Store %s: %s stands by as candidate %d"
        log.info(said, self.own, endpoint, len(self.endpoints) - 1)
        self._joined([endpoint])
        return True

    def _joined(self, endpoints: Sequence[str]) -> bool:
        """``endpoints`` joined the list we serve (their silence counts from now): any?"""
        for endpoint in endpoints:
            self.contact.admitted(endpoint)
        for call in self.admitted if endpoints else ():
            call()
        return bool(endpoints)

    def mismatch(self, given: str | None) -> str:
        """Why a client with candidate list ``given`` (a fingerprint) is refused ('' if not)."""
        if given is None or given == self.fingerprint:
            return ""
        return (
            f"the candidate at {self.own} was started with the list "
            f"{','.join(self.endpoints)!r}, another list (or order) than this client's: "
            "every agent and store must be given the same list, in the same order"
        )

    def observe(self, term: int) -> None:
        """A request showed ``term``: one higher than ours means we were replaced."""
        if term > self.term:
            if self.serving:
                self.step_down(f"a client has seen term {term}, newer than ours ({self.term})")
            self.term = term

    def promote(self, term: int, endpoints: Sequence[str] = (), list_term: int = 0) -> None:
        """Serve under ``term``, if it is newer than ours (else nothing changes);
        ``endpoints``: the promoting client's list, when it grows, served under
        ``list_term``. Serving already, we serve on under our term unless the client has
        seen a newer one (``term`` - 1): two clients that fail over at once, one of which
        asked us before the other promoted us, meet here instead of dropping the state the
        first one began (seed 505 of ``bench/simulate.py --failover``: a killed host's
        release was lost so)."""
        self.extend(endpoints, list_term)
        if term <= self.term:
            return
        if self.cut_off:
            why = "no other candidate has answered since this one was cut off"
            log.info("Store %s: not serving under term %d: %s", self.own, term, why)
            return
        if self.serving and term - 1 <= self.term:
            return  # the client saw no term newer than ours: its report of us was stale
        if self.serving:
            self.step_down(f"promoted again, under term {term}")
        self.term, self.role = term, "serving"
        self._prober.list_term = term
        self._standing_by = asyncio.Event()
        self.contact.begin()
        self.on_promote()
        said = "Store %s: now serving (candidate %d of %d, term %d)"
        log.info(said, self.own, self.index, len(self.endpoints), term)
        if self.growing and term > 1 and (self._telling is None or self._telling.done()):
            self._telling = asyncio.create_task(self._tell_the_others(), name="store-tell")
        self._keep_in_touch()

    def suspect(self, why: str) -> None:
        """A sign we may have been replaced: look for a successor for a while."""
        if not self.serving or len(self.endpoints) < 2:
            return
        self._look_until = time.monotonic() + LOOK_FOR
        if self._looking is None or self._looking.done():
            log.debug("Store %s: %s; looking for another candidate serving", self.own, why)
            self._looking = asyncio.create_task(self._look_for_successor(), name="store-look")

    async def while_serving(self, call: Coroutine[Any, Any, T]) -> T:
        """``call``'s result, unless this candidate steps down first (:class:`StoreNotServing`);
        cancelled with its caller (a long poll ends with its client)."""
        task, _ = await first_done(call, self._standing_by.wait())
        if task.cancelled():
            raise StoreNotServing(self.not_serving_message())
        return task.result()

    async def confirm_contact(self) -> None:
        """Before a request is served: when the last answer of another candidate is older
        than ``CUT_OFF``, wait for the next round of asks (this candidate steps down if
        nobody answers it)."""
        while self.serving and self.contact.stale() and self._exposed():
            self._keep_in_touch()
            self._asked.clear()
            await self._asked.wait()

    def _exposed(self) -> bool:
        """The rule applies now: a growing list of three or more, two of whose other
        candidates answered lately (see :meth:`ContactLog.exposed`)."""
        return self.watches_contact and self.contact.exposed(self._others())

    def absent(self) -> list[int]:
        """The indexes of the other candidates silent to our asks, while we serve and ask
        them (see :meth:`ContactLog.absent`): a client's search need not wait for them."""
        if not (self.serving and self.asks_others):
            return []
        return [self.endpoints.index(e) for e in self.contact.absent(self._others())]

    def _others(self) -> list[str]:
        return [e for e in self.endpoints if e != self.own]

    def _keep_in_touch(self) -> None:
        if (self.growing or self.asks_others) and (self._touching is None or self._touching.done()):
            self._touching = asyncio.create_task(self._keep_contact(), name="store-contact")

    async def _keep_contact(self) -> None:
        """While serving (or cut off), ask the other candidates every
        :data:`CONTACT_EVERY` seconds (or as the last round ends, where one waits out a
        silent candidate's probe timeout); step down on a successor, or when cut off."""
        try:
            while self.serving or self.cut_off:
                began = time.monotonic()
                if self.asks_others:
                    self._heard(began, await self._ask_the_others(began))
                await asyncio.sleep(max(0.0, began + CONTACT_EVERY - time.monotonic()))
        finally:
            self._asked.set()

    async def _ask_the_others(self, began: float) -> list[RoleReport]:
        """Every other candidate's role (one started with another list counts as silent).
        The first answer renews the contact at once: a silent candidate's probe timeout
        holds back neither the contact nor a request waiting on it."""
        body = self._prober.list_doc()

        async def one(index: int) -> RoleReport:
            try:
                report = await self._prober.ask(index, "role", body, self.term)
            except CandidateMismatch as exc:
                return RoleReport(index, self.endpoints[index], problem=str(exc))
            if report.reachable or report.refused:
                self._touched(began, report.endpoint)
            return report

        others = [i for i in range(len(self.endpoints)) if i != self.index]
        return list(await asyncio.gather(*(one(i) for i in others)))

    def _touched(self, began: float, endpoint: str) -> None:
        """The candidate at ``endpoint`` answered (or refused) an ask sent at ``began``."""
        self.contact.heard(began, endpoint)
        if self.cut_off:
            log.info("Store %s: another candidate answers again", self.own)
            self.cut_off = False
        self._asked.set()

    def _heard(self, began: float, reports: list[RoleReport]) -> None:
        """What a round of asks begun at ``began`` showed: a successor, or none answering.
        A round that outlasted its timeout by :data:`STALL` ran while this process stood
        still (frozen, or starved): its silence may be our own, so the next round
        decides (the others' answers to it may have waited unread)."""
        for report in reports:
            if not self.outranked(report) and report.term > self.term:
                if self.serving:
                    self.step_down(f"{report.endpoint} has seen term {report.term}")
                self.term = report.term
        answered = any(report.reachable or report.refused for report in reports)
        stalled = time.monotonic() - began > self._prober.timeout + STALL
        if (
            not answered
            and self.serving
            and self.contact.stale()
            and not stalled
            and self._exposed()
        ):
            self.cut_off = True
            self.step_down(
                f"cut off: none of the {len(reports)} other candidates has answered for "
                f"{time.monotonic() - self.contact.last:.1f}s; those that reach each other may "
                "have promoted one of theirs"
            )
        self._asked.set()

    def not_serving_message(self) -> str:
        return f"the candidate at {self.own} stands by (term {self.term}); it does not serve"

    async def _look_for_successor(self) -> None:
        body = self._prober.list_doc() if self.growing else None
        while self.serving and time.monotonic() < self._look_until:
            if any(map(self.outranked, await self._prober.roles(self.term, self.index, body))):
                return
            await asyncio.sleep(LOOK_EVERY)

    async def _tell_the_others(self) -> None:
        """Tell every other candidate our term and list: every :data:`LOOK_EVERY` seconds
        until it has heard them, every :data:`TELL_AGAIN` after."""
        heard: dict[str, float] = {}
        while self.serving:
            now = time.monotonic()
            due = [
                i
                for i, endpoint in enumerate(self.endpoints)
                if i != self.index and heard.get(endpoint, 0.0) <= now
            ]
            for report in await self._prober.roles_of(due, self.term, self._prober.list_doc()):
                if self.outranked(report):
                    return
                told = report.reachable and report.term >= self.term
                heard[report.endpoint] = now + (TELL_AGAIN if told else 0.0)
            await asyncio.sleep(LOOK_EVERY)

    async def ask(self, endpoint: str, op: str, body: dict[str, Any]) -> RoleReport:
        """``op`` at the candidate at ``endpoint`` of our list, under our term."""
        return await self._prober.ask(self.endpoints.index(endpoint), op, body, self.term)

    async def recall(self, endpoints: Sequence[str]) -> bool:
        """A restarted seed, ask ``endpoints`` (the list we served before) for one serving
        the job under a newer term: stand by for it and take its list (True)."""
        reports = await self._prober.peers([e for e in endpoints if e != self.own], self.term)
        for report in sorted(reports, key=lambda r: (r.term, r.list_term), reverse=True):
            if report.term > self.term and self.outranked(report):
                self.extend(report.endpoints, report.list_term)
                return True
        return False

    def outranked(self, report: RoleReport) -> bool:
        """``report`` shows a candidate serving ahead of us (a newer term, or ours at a
        lower index): we step down, and take its term."""
        if not (report.serving and (report.term, -report.index) > (self.term, -self.index)):
            return False
        if self.serving:
            self.step_down(f"{report.endpoint} serves under term {report.term}")
        self.term = max(self.term, report.term)
        return True

    def step_down(self, why: str, level: int = logging.INFO) -> None:
        said = "Store %s: stepping down (%s); another candidate serves: standing by, state dropped"
        log.log(level, said, self.own, why)
        self.role = "standby"
        self._standing_by.set()
        if self.on_step_down is not None:
            task = asyncio.create_task(self.on_step_down())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for asking in (self._looking, self._telling, self._touching):
            await cancel_and_wait(asking)
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        await self._prober.close()
