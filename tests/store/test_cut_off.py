"""A serving candidate of a growing list that no other candidate answers steps down, over
real HTTP on loopback addresses (:mod:`agentd.store.candidacy`, "cut off"): the others,
on the far side of a partition, may have promoted one of theirs.

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
from agentd.store.api import StoreNotServing
from agentd.store.candidacy import Candidacy
from agentd.store.candidates import Prober, RoleReport
from agentd.store.http_client import HttpStore
from agentd.store.server import StoreServer
from tests.conftest import free_port

TOKEN = "secret"
CUT_OFF = 0.6
PROBE = 0.2
PRESENT = 1.5


@pytest.fixture(autouse=True)
def short_periods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(candidacy_module, "CUT_OFF", CUT_OFF)
    monkeypatch.setattr(candidacy_module, "CONTACT_EVERY", 0.1)
    monkeypatch.setattr(candidacy_module, "PRESENT", PRESENT)


class Silent:
    """Takes connections on ``host``:``port`` and never answers (a host cut off)."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def start(self, host: str, port: int) -> None:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._held.append(writer)
            with contextlib.suppress(ConnectionError):
                while await reader.read(4096):
                    pass

        self._server = await asyncio.start_server(hold, host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in self._held:
                writer.close()
            await self._server.wait_closed()
            self._server = None


class Group:
    """Candidate 0 of a growing list of ``count`` on 127.0.0.1, .2, ...: the others stand
    by and answer, until :meth:`silence` cuts one off (or :meth:`stop` ends it: refused)."""

    def __init__(self, count: int) -> None:
        self.port = free_port()
        self.endpoints = [f"127.0.0.{i + 1}:{self.port}" for i in range(count)]
        self.silent = [Silent() for _ in range(count)]
        self.servers: dict[int, StoreServer] = {}

    def candidacy(self, index: int) -> Candidacy:
        prober = functools.partial(Prober, timeout=PROBE)
        return Candidacy(self.endpoints, index, TOKEN, growing=True, prober=prober)

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
        if candidacy.watches_contact:  # a list of two asks nothing
            await until(lambda: others <= set(candidacy._answered))
        return candidacy

    async def close(self) -> None:
        for index in list(self.servers):
            await self.stop(index)
        for silent in self.silent:
            await silent.stop()


@pytest.fixture
async def group() -> AsyncIterator[Callable[[int], Group]]:
    made: list[Group] = []

    async def make(count: int) -> Group:
        one = Group(count)
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
    candidacy._contact = now - 2 * CUT_OFF  # stale, though both answered within PRESENT
    candidacy._heard(now - (PROBE + candidacy_module.STALL + 0.5), silent)  # stood still
    assert candidacy.serving and not candidacy.cut_off
    candidacy._heard(now - PROBE, silent)  # a round that ran in time: cut off
    assert candidacy.cut_off and not candidacy.serving
