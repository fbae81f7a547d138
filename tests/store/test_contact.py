"""A serving candidate of a list of three or more asks the others every second, over real
HTTP on loopback addresses (:mod:`agentd.store.contact`): in a growing list, when no
other candidate answers, it steps down (:mod:`agentd.store.candidacy`, "cut off": the
others, on the far side of a partition, may have promoted one of theirs); in any list,
while others answer, it names the silent ones in its answers, and a client's search does
not wait out their probe timeout.

The other candidates answer at first, then fall silent as a partitioned host sees them:
a listener on their address that takes the connection and never answers. The probe
timeout and the rule's periods are shortened, so each test takes a second or two."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable

import pytest

from agentd.store import candidacy as candidacy_module
from agentd.store import contact as contact_module
from agentd.store.api import StoreNotServing
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import SPARED, Prober, RoleReport
from agentd.store.failover import FailoverStore
from agentd.store.http_client import HttpStore
from agentd.store.server import StoreServer
from agentd.store.wire import index_list
from tests.conftest import free_port

TOKEN = "secret"
CUT_OFF = 0.6
PROBE = 0.2
PRESENT = 1.5


@pytest.fixture(autouse=True)
def short_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contact_module, "CUT_OFF", CUT_OFF)
    monkeypatch.setattr(candidacy_module, "CONTACT_EVERY", 0.1)
    monkeypatch.setattr(contact_module, "PRESENT", PRESENT)


class Silent:
    """Takes connections on ``host``:``port`` and never answers (a host cut off)."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._held: list[_Held] = []
        self.stopped = False

    async def start(self, host: str, port: int) -> None:
        self.stopped = False
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Held(self), host, port)

    async def stop(self) -> None:
        """Stop listening and close every connection taken, those whose protocol has not
        yet been told of its transport too: a candidate's asks connect all the time, and a
        connection accepted just before the close, left open, outlived the test's loop."""
        if self._server is not None:
            self.stopped = True
            self._server.close()
            for held in self._held:
                held.close()
            await self._server.wait_closed()
            await asyncio.sleep(0)  # a yield: connections accepted before the close are told
            self._server = None


class _Held(asyncio.Protocol):
    """One connection a :class:`Silent` holds: read and never answered."""

    def __init__(self, silent: Silent) -> None:
        self._silent = silent
        self._transport: asyncio.BaseTransport | None = None
        silent._held.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if self._silent.stopped:
            transport.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class Group:
    """Candidate 0 of a list of ``count`` on 127.0.0.1, .2, ... (growing from the first,
    or given whole): the others stand by and answer, until :meth:`silence` cuts one off
    (or :meth:`stop` ends it: refused)."""

    def __init__(self, count: int, growing: bool = True) -> None:
        self.growing = growing
        self.port = free_port()
        self.endpoints = [f"127.0.0.{i + 1}:{self.port}" for i in range(count)]
        self.silent = [Silent() for _ in range(count)]
        self.servers: dict[int, StoreServer] = {}

    def candidacy(self, index: int) -> Candidacy:
        prober = functools.partial(Prober, timeout=PROBE)
        return Candidacy(self.endpoints, index, TOKEN, growing=self.growing, prober=prober)

    async def answer(self, index: int) -> StoreServer:
        await self.silent[index].stop()
        server = StoreServer(
            f"127.0.0.{index + 1}", self.port, TOKEN, candidacy=self.candidacy(index)
        )
        await server.start()
        self.servers[index] = server
        return server

    async def stop(self, index: int) -> None:
        await self.servers.pop(index).stop()

    async def silence(self, index: int) -> None:
        await self.stop(index)
        await self.silent[index].start(f"127.0.0.{index + 1}", self.port)

    async def serving(self) -> Candidacy:
        """Candidate 0, promoted, once every other one has answered its asks."""
        candidacy = (await self.answer(0)).candidacy
        assert candidacy is not None
        candidacy.promote(1)
        others = set(self.endpoints[1:])
        if candidacy.asks_others:  # a list of two asks nothing
            await until(lambda: others <= set(candidacy.contact.answered))
        return candidacy

    async def close(self) -> None:
        for index in list(self.servers):
            await self.stop(index)
        for silent in self.silent:
            await silent.stop()


@pytest.fixture
async def group() -> AsyncIterator[Callable[[int], Group]]:
    made: list[Group] = []

    async def make(count: int, growing: bool = True) -> Group:
        one = Group(count, growing)
        made.append(one)
        for index in range(1, count):
            await one.answer(index)
        return one

    yield make  # type: ignore[misc]
    for one in made:
        await one.close()


def client_of(group: Group) -> HttpStore:
    return HttpStore(group.endpoints[0], TOKEN, retry_timeout=1.0, request_timeout=5.0)


async def until(condition: Callable[[], bool], deadline: float = 10.0) -> None:
    ends = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < ends, "the condition never came true"
        await asyncio.sleep(0.02)


async def test_a_serving_candidate_no_other_answers_steps_down_and_takes_no_promotion(group):
    three = await group(3)
    candidacy = await three.serving()
    client = client_of(three)
    try:
        await client.set("k", b"v")
        await three.silence(1)
        await three.silence(2)  # cut off from both
        await until(lambda: candidacy.cut_off)
        assert candidacy.role == "standby"
        assert candidacy.document()["cut_off"] is True  # /status's store.hosting says so
        with pytest.raises(StoreNotServing):
            await client.set("k", b"w")
        candidacy.promote(2)  # a client on this side of the partition: refused
        assert candidacy.role == "standby" and candidacy.term == 1

        await three.answer(1)  # the partition heals: candidate 1 answers (standing by)
        await until(lambda: not candidacy.cut_off)
        assert candidacy.document()["cut_off"] is False
        candidacy.promote(2)
        assert candidacy.role == "serving" and candidacy.term == 2
    finally:
        await client.close()


async def test_a_candidate_in_touch_serves_on_and_steps_down_once_the_others_fall_silent(group):
    """While other candidates answer, the rounds of asks keep the contact fresh; once
    none does, no request is served more than CUT_OFF after the last answer."""
    three = await group(3)
    candidacy = await three.serving()
    client = client_of(three)
    try:
        await asyncio.sleep(2 * CUT_OFF)  # the rounds go on: contact stays fresh
        await client.set("k", b"v")
        assert candidacy.serving
        await three.silence(1)
        await three.silence(2)
        silent = time.monotonic()
        served = silent
        with contextlib.suppress(StoreNotServing):
            while served - silent < 10 * CUT_OFF:  # a lease renewal, again and again
                await client.set("k", b"v")
                served = time.monotonic()
        assert served - silent <= 2 * CUT_OFF  # CUT_OFF and a round of asks, on a slow host
        assert candidacy.cut_off and not candidacy.serving
    finally:
        await client.close()


async def serves_on(group: Group, candidacy: Candidacy) -> None:
    """Several CUT_OFFs later, candidate 0 still serves a request, and was never cut off."""
    await asyncio.sleep(3 * CUT_OFF)
    client = client_of(group)
    try:
        await client.set("k", b"v")
    finally:
        await client.close()
    assert candidacy.serving and not candidacy.cut_off


async def test_a_candidate_silent_for_long_no_longer_counts(group):
    """A candidate silent for PRESENT while this one heard another was lost (a growing list
    never drops it): when the last other one falls silent too, one candidate alone could
    not promote itself, so this one serves on (a long job whose lost hosts filled the
    list would otherwise stop when one more is lost)."""
    three = await group(3)
    candidacy = await three.serving()
    await three.silence(2)
    await asyncio.sleep(PRESENT + CUT_OFF)
    await three.silence(1)
    await serves_on(three, candidacy)


async def test_two_candidates_never_apply_it(group):
    """The other one alone never promotes itself while ours is silent (it may be the one
    cut off), so a list of two serves on."""
    two = await group(2)
    candidacy = await two.serving()
    await two.silence(1)
    await serves_on(two, candidacy)


async def test_a_given_list_never_applies_it(group):
    """A given list's candidates may be stores apart from the agents: one cut off from
    them may still serve its clients, so it serves on (asking, and naming no one)."""
    three = await group(3, growing=False)
    candidacy = await three.serving()
    await three.silence(1)
    await until(lambda: candidacy.absent() == [1])  # it asks them too
    await three.silence(2)
    await until(lambda: candidacy.absent() == [])  # hearing nobody, it names nobody
    await serves_on(three, candidacy)


async def test_a_refused_candidate_is_contact(group):
    """A host that refuses the connection (its agent died) is reachable: the refusal
    proves this host is not cut off, and a dead candidate promotes nobody."""
    three = await group(3)
    candidacy = await three.serving()
    await three.stop(1)
    await three.stop(2)  # nothing listens there: refused at once
    await serves_on(three, candidacy)


async def test_a_round_of_asks_that_stood_still_decides_nothing(group):
    """A process that stood still (frozen, starved) while its asks were out times them
    out before it reads the answers: that silence is its own, so such a round steps
    nothing down, and the next one decides. Without this, a store host frozen for 3-8 s
    (less than the others take to fail over) stepped down on waking, and the whole job
    re-formed."""
    three = await group(3)
    candidacy = await three.serving()
    silent = [
        RoleReport(index, three.endpoints[index], problem="no answer within the probe timeout")
        for index in (1, 2)
    ]
    await three.silence(1)
    await three.silence(2)
    now = time.monotonic()
    candidacy.contact.last = now - 2 * CUT_OFF  # stale, though both answered within PRESENT
    candidacy._heard(now - (PROBE + candidacy_module.STALL + 0.5), silent)  # stood still
    assert candidacy.serving and not candidacy.cut_off
    candidacy._heard(now - PROBE, silent)  # a round that ran in time: cut off
    assert candidacy.cut_off and not candidacy.serving


# -- the silent candidates, named in the answers ---------------------------------------------


async def absent_said(client: HttpStore | FailoverStore, expected: frozenset[int]) -> None:
    """Send requests until the serving candidate's answers name ``expected`` as absent."""
    ends = time.monotonic() + 10.0
    while True:
        await client.set("k", b"v")
        if client.absent == expected:
            return
        assert time.monotonic() < ends, f"absent stayed {sorted(client.absent)}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("growing", [True, False], ids=["growing", "given"])
async def test_the_serving_candidate_names_the_silent_ones_in_its_answers(group, growing):
    """A candidate silent to the asks for CUT_OFF is named; one that refuses (its host is
    up) is not, nor one that answers again."""
    four = await group(4, growing)
    candidacy = await four.serving()
    client = client_of(four)
    try:
        await absent_said(client, frozenset())
        await four.silence(2)
        await four.stop(3)
        await absent_said(client, frozenset({2}))
        assert candidacy.document()["absent"] == [four.endpoints[2]]  # /status says so
        await four.answer(2)
        await absent_said(client, frozenset())
    finally:
        await client.close()


async def test_nobody_is_named_while_the_serving_candidate_hears_no_other(group):
    """A serving candidate that hears nobody may be the one cut off: it names no one (a
    client's search then waits for every candidate)."""
    three = await group(3)
    candidacy = await three.serving()
    await three.silence(1)
    await until(lambda: candidacy.absent() == [1])
    await three.silence(2)
    await until(lambda: candidacy.absent() == [] and not candidacy.serving)


@pytest.mark.parametrize("growing", [True, False], ids=["growing", "given"])
async def test_a_search_does_not_wait_out_a_candidate_named_silent(group, growing):
    """The store's host lost after another host was: the search takes the others' answers
    and promotes the next candidate without waiting out the lost one's probe timeout,
    which is made longer here than the test's whole deadline."""
    long_probe = 60.0
    four = await group(4, growing)
    await four.serving()
    client = FailoverStore(
        four.endpoints,
        TOKEN,
        growing=growing,
        retry_timeout=30.0,
        request_timeout=5.0,
        prober=functools.partial(Prober, timeout=long_probe),
    )
    try:
        await client.set("k", b"v")  # a given list's client finds the server first
        await four.silence(1)  # a host lost earlier: below the next candidate to promote
        await absent_said(client, frozenset({1}))
        await four.stop(0)  # the store's agent is killed: refused
        async with asyncio.timeout(long_probe / 3):
            await client.set("k", b"w")
        assert client.serving == 2 and client.failovers == 1
        assert client.failed[four.endpoints[1]] == SPARED
    finally:
        await client.close()


async def test_a_candidate_named_silent_that_answers_in_time_counts(group):
    """Not waiting for a spared candidate leaves out only its silence: its answer, when it
    comes with the others', is read (here, the lowest standing by, so it is promoted)."""
    three = await group(3)
    await three.serving()
    prober = Prober(three.endpoints, TOKEN, timeout=PROBE, growing=True)
    try:
        reports = await prober.roles(1, skip=0, spare={1, 2})
        assert [report.role for report in reports] == ["standby", "standby"]
        await three.silence(2)
        reports = await prober.roles(1, skip=0, spare={2})
        assert reports[0].role == "standby" and reports[1].problem == SPARED
        reports = await prober.roles(1, skip=0)  # waited for: its probe timeout
        assert reports[1].problem == "no answer within the probe timeout"
        assert await prober.roles_of([], 1, spare={2}) == []  # none due: nothing to ask
    finally:
        await prober.close()


@pytest.mark.parametrize(
    ("header", "indexes"),
    [("", set()), ("2", {2}), ("1,3", {1, 3}), ("1,,x,-2, 3,99999", {1}), ("7,7", {7})],
)
def test_the_header_naming_silent_candidates_reads_indexes_alone(header, indexes):
    assert index_list(header) == indexes
