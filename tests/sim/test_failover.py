"""The membership protocol with the store served by agent 0 and the others standing by,
the defaults under Slurm and Kubernetes, under seeded fault schedules
(``python bench/simulate.py --failover``; see :mod:`tests.sim.failover` for what is real).

Each fixed finding keeps its seed here; the gaps left are in docs/protocol.md.
"""

from __future__ import annotations

import pytest

from agentd.rendezvous.conf import RendezvousSettings
from agentd.rendezvous.exit_barrier import ExitBarrier
from agentd.rendezvous.forgotten import lifetime
from tests.sim.failover import store_host_lost_bound
from tests.sim.test_protocol import BATCH_TIMEOUT, at, rounds_of
from tests.sim.world import AGENT_FAULTS, KINDS, Fault, Schedule, schedule_for, simulate

SEEDS = range(60)
CHUNK = 30

KNOWN_GAPS: dict[int, str] = {}
"""Seed -> the invariants it breaks today in these seeds (see the gaps below)."""


def failover_seed(seed: int):
    return simulate(schedule_for(seed, failover=True))


@pytest.mark.parametrize("first", range(SEEDS.start, SEEDS.stop, CHUNK))
@BATCH_TIMEOUT
def test_the_seeds_break_no_invariant_beyond_the_known_gaps(first):
    seeds = range(first, min(first + CHUNK, SEEDS.stop))
    found = {}
    for seed in seeds:
        outcome = failover_seed(seed)
        if outcome.violations:
            found[seed] = "+".join(sorted({v.split(" ")[0] for v in outcome.violations}))
    assert found == {s: g for s, g in KNOWN_GAPS.items() if s in seeds}, found


RESTART_SEEDS = range(40)
"""Seeds drawn with restarts among the faults (``--kinds ...,restart``): a sample that
earns its seconds in the suite; the soaks of thousands are ``bench/simulate.py``'s."""


@BATCH_TIMEOUT
def test_seeds_with_restarts_break_no_invariant():
    """A node SIGKILLed and started again, the store's host at the endpoint: its fresh
    list forks from the job's (see the tests below)."""
    kinds = (*KINDS, "restart")  # the store's own faults are not drawn with failover
    drawn = [schedule_for(seed, kinds, failover=True) for seed in RESTART_SEEDS]
    assert sum(f.kind == "restart" and f.target == 0 for s in drawn for f in s.faults) >= 5
    found = {s.seed: simulate(s).violations for s in drawn}
    assert {seed: v for seed, v in found.items() if v} == {}


def test_without_faults_the_others_stand_by_and_one_round_forms():
    outcome = simulate(Schedule(0, 4, 2, 4, (), failover=True))
    assert outcome.violations == []
    assert outcome.rounds == 1


def test_the_store_host_killed_its_guardian_releases_it_at_the_candidate_now_serving():
    """S3 for a SIGKILL of the store's host: the others fail over (its port refuses at
    once) and its guardian marks it gone in the new store, so the round it forgot is
    accounted for at once: the others are in a new round within 3 s."""
    outcome = simulate(Schedule(0, 3, 2, 3, (Fault(10.0, "kill", 0),), failover=True))
    assert outcome.violations == []
    assert any("guardian 0: released" in n for n in outcome.notes), outcome.notes
    restarted = [at(n) for n in outcome.notes if ": round 1, rank" in n]
    assert len(restarted) == 2 and all(10.0 < t <= 13.0 for t in restarted), outcome.notes


def test_a_store_host_lost_whole_costs_one_failover_and_the_forgotten_rounds_fence():
    """Seed 53's shape: the new store cannot know the lost member's lease, so it fences
    the round it forgot for one lease, the guardian's slack, the fence and the cut-off
    store's last renewals (:func:`~agentd.rendezvous.forgotten.lifetime`), and the first
    member back counts the rest gone when that fence ends (before: the last call, 30 s
    after the failover)."""
    outcome = simulate(Schedule(0, 3, 2, 3, (Fault(10.0, "lose_host", 0),), failover=True))
    assert outcome.violations == []
    restarted = [at(n) for n in outcome.notes if ": round 1, rank" in n]
    assert len(restarted) == 2, outcome.notes
    cost = max(restarted) - 10.0
    settings = RendezvousSettings(2, 3)
    assert lifetime(settings.heartbeat_ttl) <= cost <= store_host_lost_bound(settings), cost


def test_a_member_that_never_saw_its_round_sealed_counts_back_after_a_failover(monkeypatch):
    """Seed 25946's shrunk schedule: the store's host leaves (SIGTERM) 20 ms after round 0
    was sealed, before agent 1 read the seal. The new store forgot the round; its other
    members told it so, naming the server the round was sealed in, and agent 1 held a
    place there, so it counts back as they do. Before, the next round waited for the
    forgotten round's fence to end, as for a member never to be seen again. Agent 1
    itself moved the generation past round 0 (its entry was gone as it sealed) before
    the others wrote that record, so it asks for it while it waits in round 1. (At
    30.14 s, as shrunk; 30.058 s since the clients tell a serving candidate with a
    shorter list theirs: those requests moved the seeded latencies, and the seal, so
    the SIGTERM is 20 ms after it again.) Since 2026-12-02 the leaving host hands the store
    down with its state, so the round is not forgotten at all: agent 1 reads the seal there
    and the three re-form at once; the hand-down is turned off to keep the forgotten
    round's path checked."""
    schedule = Schedule(25946, 4, 1, 5, (Fault(30.058, "term", 0),), failover=True)
    outcome = simulate(schedule)
    assert outcome.violations == []
    restarted = [at(n) for n in outcome.notes if ": round 1, rank" in n]
    assert len(restarted) == 3 and max(restarted) - 30.14 < 3.0, outcome.notes
    monkeypatch.setattr(ExitBarrier, "_pass_the_store_on", _not_passed_on)
    outcome = simulate(schedule)
    assert outcome.violations == []
    assert not any("agent 1: round 0," in n for n in outcome.notes), outcome.notes
    restarted = [at(n) for n in outcome.notes if ": round 1, rank" in n]
    assert len(restarted) == 3 and max(restarted) - 30.14 < 3.0, outcome.notes


def test_a_store_host_that_leaves_as_its_round_is_sealed_leaves_it_as_a_member():
    """The same schedule, the SIGTERM 0.5 ms earlier: the host's own wait for the seal is
    cancelled before it reads it, while agents 2 and 3 read it and start workers. The
    host leaves the round as a member (it hands the store over and marks itself gone
    there), so the others re-form at once; before, it ended the round as a forming one
    in the store it was closing, and they waited 20 s for the forgotten round's fence."""
    outcome = simulate(Schedule(25946, 4, 1, 5, (Fault(30.1175, "term", 0),), failover=True))
    assert outcome.violations == []
    assert not any("agent 0: round 0," in n for n in outcome.notes), outcome.notes
    assert any("agent 2: round 0," in n for n in outcome.notes), outcome.notes
    restarted = [at(n) for n in outcome.notes if ": round 1, rank" in n]
    assert len(restarted) == 3 and max(restarted) - 30.1175 < 3.0, outcome.notes


def test_a_candidate_on_a_host_lost_earlier_costs_a_later_failover_nothing():
    """Agent 2's host (candidate 1) is lost whole; 40 s later the store's host is killed.
    The serving candidate's answers had named candidate 1 silent, and so had agent 0's
    will, so neither the others' search nor the guardian's waits out its 2 s probe
    timeout: the others re-form within a second of the kill (2.1 s before)."""
    faults = (Fault(30.0, "lose_host", 2), Fault(70.0, "kill", 0))
    outcome = simulate(Schedule(313, 5, 1, 5, faults, failover=True))
    assert outcome.violations == []
    restarted = [at(n) for n in outcome.notes if ": round 2, rank" in n]
    assert len(restarted) == 3 and max(restarted) - 70.0 < 1.0, outcome.notes


def test_a_store_host_cut_off_from_every_other_candidate_steps_down():
    """Seed 882's shrunk schedule: agent 0, serving the store, is partitioned for 21 s.
    The others fail over and re-form without it once the fence of the round the new
    store forgot has ended; agent 0 hears no other candidate for 3 s and steps down, so
    its own agent renews no lease and forms no round alone (MIN 1), as it did before
    (S1: two jobs at once). Once the partition heals it joins the others."""
    partition = Fault(28.39, "partition", 0, 20.91)
    outcome = simulate(Schedule(882, 4, 1, 4, (partition,), failover=True))
    assert outcome.violations == []
    rounds = [n for n in outcome.notes if ": round " in n and "rank" in n]
    assert not any(" of 1" in n for n in rounds), rounds
    back = [at(n) for n in rounds if "agent 0: round " in n and at(n) > 28.39 + 20.91]
    assert back, outcome.notes


def test_a_member_cut_off_from_every_other_candidate_never_promotes_its_own():
    """Seed 545's finding, as a schedule of its own: a partitioned member reaches only the
    candidate on its own host (loopback), and promoting it formed a job of its own (MIN
    1). Since members offer their candidates before their first round, the seed's own
    faults make the agent cut off the store's host instead, the documented gap."""
    partition = Fault(40.0, "partition", 2, 20.0)
    outcome = simulate(Schedule(545, 4, 1, 5, (partition,), failover=True))
    assert outcome.violations == []


def test_a_restarted_store_hosts_fork_gives_way_to_the_jobs_list():
    """``bench/bench_seed_back.py --both-lost``'s shape: the store's host SIGKILLed and
    restarted at the endpoint 10.5 s later, a member SIGKILLed 10 s after it and restarted
    (on a host of its own) 0.5 s later. The restarted seed serves a fresh list under term
    1 and admits the new node to it before the job's server tells it term 2; told, both
    take the job's list, and the three are in one round within 3 s. Before, the fork's
    clients promoted the seed under term 3, the job's server stepped down, its gone mark
    of the killed member dropped, and the round waited for the fence of the one the
    seed's store forgot: 22 s."""
    faults = (Fault(40.0, "restart", 0, 10.5), Fault(50.0, "restart", 1, 0.5))
    outcome = simulate(Schedule(0, 3, 2, 4, faults, failover=True))
    assert outcome.violations == []
    back = {n.split("s ", 1)[1].split(":")[0]: at(n) for n in outcome.notes if ": round 2, " in n}
    assert set(back) == {"agent 2", "agent 3", "agent 4"}, outcome.notes
    assert max(back.values()) - 50.0 <= 3.0, outcome.notes


def test_a_new_node_beside_a_round_whose_places_late_arrivals_took_is_admitted():
    """Seed 8933 of ``--kinds ...,restart``, shrunk: the store's host restarted arrives
    after the job re-formed with four of five, and is killed again; its restart arrives
    too. The round's five places were taken (four members, one late arrival), but it was
    sealed with four: there is room, so the new node ends the round to be admitted, as a
    late arrival does. Before, it counted the round full and waited beside it for ever
    (S5)."""
    faults = (Fault(18.19, "restart", 0, 1.25), Fault(20.226, "restart", 5, 0.0))
    outcome = simulate(Schedule(8933, 5, 2, 5, faults, failover=True))
    assert outcome.violations == [], outcome.notes
    assert any("agent 6: round" in n for n in outcome.notes), outcome.notes


def test_a_store_host_restarted_before_anyone_failed_over_learns_the_members_list():
    """Seed 1819 of ``--kinds ...,restart``, shrunk: the store's host restarts at the
    endpoint at once, so the others' next requests reach its new store, which knows the
    seed alone; the members, in its list already, offer nothing. Their clients now tell
    it the list, so when it is killed 30 s later its guardian releases it through the
    candidate promoted, and the others re-form within S3's 3 s. Before, the guardian knew
    no other candidate and the round waited for the forgotten round's fence (20 s)."""
    faults = (Fault(0.36, "restart", 0, 0.0), Fault(30.77, "kill", 4))
    outcome = simulate(Schedule(1819, 4, 1, 4, faults, failover=True))
    assert outcome.violations == [], outcome.notes
    assert any("guardian 4: released" in n for n in outcome.notes), outcome.notes


def test_a_store_host_restarted_at_once_fences_the_round_its_store_forgot():
    """Seed 162 of ``--kinds ...,restart``, shrunk: a ``2:2`` job's store host SIGKILLed
    and back at the endpoint in the same instant, as a new node arrives. The two sealed
    round 0 in the empty store 33 ms later, beside the other member's worker of the old
    round 0 (S1). The host now keeps its last round on its disk, so its new store's first
    round waits until that round's members are back or gone (without the record, S1 at
    0.179 s still)."""
    faults = (Fault(0.146, "restart", 0, 0.0), Fault(0.146, "join", 3))
    outcome = simulate(Schedule(162, 2, 2, 2, faults, failover=True))
    assert outcome.violations == [], outcome.notes
    after = [n for n in outcome.notes if ", rank" in n and at(n) > 0.146]
    assert [n.split(": ")[1].split(",")[0] for n in after] == ["round 1"] * 2, outcome.notes


def test_a_restarted_store_host_asks_the_list_it_kept_for_the_job():
    """Seed 14063 of ``--kinds ...,restart``, shrunk: a ``2:3`` job's store host restarts
    2.07 s after its kill, while the job lives on at the candidate it failed over to, and
    its agent is stopped 0.2 s later as a new node arrives. Nobody had told the restarted
    host the job's term, so the new node learned its fresh list alone, and once it was
    gone knew no candidate of the job (S5). The host now keeps its list with its round and
    asks it as it starts: it stands by for the job's candidate, and the new node learns
    the job's list from it."""
    faults = (Fault(36.1, "restart", 0, 2.07), Fault(38.36, "term", 2), Fault(38.36, "join", 3))
    outcome = simulate(Schedule(14063, 2, 2, 3, faults, failover=True))
    assert outcome.violations == [], outcome.notes
    assert any("agent 3: round" in n for n in outcome.notes), outcome.notes


@pytest.mark.parametrize(
    ("seed", "finding"),
    [
        (155, "round 0 ended in a store that failed over, without the fence for it"),
        (56, "a heartbeat retried through a failover read as one a frozen store held"),
        (505, "two clients failing over at once dropped the new store's first state"),
        (839, "the round's last arrival never counted itself back in a new store"),
        (4566, "a killed member's release tried the lost seed first, for 5 s"),
        (8937, "the same, after the seed's host and agent were lost and killed"),
        (4764, "a store host that left dropped the store 30 s later: a second restart"),
        (1681, "a failed heartbeat began no search for the next server"),
        (1270, "a store host that left before every member stood by stranded one"),
        (949, "gone marks from a lease check in the old store, written in the new one"),
        (2887, "the same, with nnodes 3:4 (MIN above half of MAX)"),
        (27581, "a sealer fenced a round the new store forgot, waiting for ever"),
        (28208, "a join whose count's answer was lost arrived twice; its first place sealed"),
        (27665, "an entry written in a new store at a place the old one gave"),
        (20307, "the same, leaving two agents spares beside a round with room"),
        (22498, "a member that found the round full was never counted back: 16.5 s"),
        (26183, "the same, after a round with a stopped store host"),
        (47215, "a fence's mark written after a failover, in a store without the fence"),
        (46256, "a member that knew the seed alone found the job through a peer"),
        (2929, "a list grown during a search asked a lost host's candidate twice: 4.1 s"),
        (5548, "the same search, kept answers from before this host was cut off: S1"),
        (10409, "a guardian promoted beside a frozen seed, under its term: a split job"),
        (8218, "two leaves at once: the first closed the store under the second: 16.5 s"),
        (1611, "a full round nobody sealed: its spares waited for ever"),
        (54457, "every member lost the host as round 0 was sealed: the join timeout"),
        (5779, "a seal read after a failover was the new store's: two workers of a rank"),
        (42455, "a round's end mark resent to a new store, its generation not moved"),
        (25946, "a last call's seal waited 15 s in a new store for entries it never had"),
        (65153, "a member that never read the seal asked the new store too soon: 30 s"),
        (882, "a store host cut off from every other candidate formed a round alone: S1"),
        (911, "the same, with 3 agents"),
    ],
)
def test_each_fixed_finding_keeps_its_seed(seed, finding):
    assert failover_seed(seed).violations == [], finding


FINISH_KINDS = (*AGENT_FAULTS, "join", "finish")
"""``--kinds kill,lose_host,term,stop,partition,join,finish`` (the store's own faults are
not drawn with failover)."""


def test_a_store_host_sigtermed_in_its_exit_barrier_keeps_the_others_working(monkeypatch):
    """Seed 382 of ``--failover --kinds kill,lose_host,term,stop,partition,join,finish``:
    agent 0, the store's host, is SIGTERMed in its exit barrier while agents 1, 2 and 4
    still work. It handed the store over at once, the next candidate started empty, and
    the three stopped their workers mid-work (S7). It now hands the store, state and all,
    to one of them as it enters its barrier; where it could not, keeps the store up for
    them as it leaves (``close_timeout`` at most); and then passes it on with its state as
    it leaves: each alone keeps S7, and with none (the hand-over of before) S7 breaks
    again."""
    schedule = schedule_for(382, FINISH_KINDS, failover=True)
    assert any(f.kind == "term" and f.target == 0 for f in schedule.faults)
    assert simulate(schedule).violations == []

    async def hand_over_at_once(self) -> bool:
        return False

    monkeypatch.setattr(ExitBarrier, "_serve_the_others", hand_over_at_once)
    assert simulate(schedule).violations == []  # handed down: its leave ends no round
    monkeypatch.setattr(ExitBarrier, "_hand_the_store_down", _not_handed_down)
    assert simulate(schedule).violations == []  # passed on with its state as it leaves
    monkeypatch.setattr(ExitBarrier, "_pass_the_store_on", _not_passed_on)
    [violation] = simulate(schedule).violations
    assert violation.startswith("S7") and "after agent 0" in violation, violation


async def _not_passed_on(self, current) -> bool:
    """A leave before 2026-12-02 (the third change): the store handed over empty."""
    return False


async def _not_handed_down(self, gen: int, size: int) -> bool:
    """The exit barrier before 2026-12-02 (the third change): the store stays with its host."""
    return True


@pytest.mark.parametrize(
    ("kind", "duration"), [("kill", 0.0), ("lose_host", 0.0), ("stop", 25.0), ("partition", 25.0)]
)
def test_a_store_host_lost_in_its_exit_barrier_ends_no_round(kind, duration, monkeypatch):
    """Agent 0, the store's host, finishes while agents 1 and 2 work, and in its exit
    barrier it is SIGKILLed, its host is lost, or it is frozen or cut off past its lease.
    The store went with it: the new server started empty, and the others' round went
    with the old state (their workers stopped mid-work, a second round formed). Now it
    hands the store to one of them as it enters its barrier: S7 is judged for it as for
    any member, and the round goes on."""
    faults = (Fault(5.0, "finish", 0), Fault(7.0, kind, 0, duration))
    outcome = simulate(Schedule(1, 3, 2, 3, faults, failover=True))
    assert outcome.violations == [], outcome.notes
    assert not rounds_of(outcome, 1), outcome.notes  # no round after the first
    assert not [n for n in outcome.notes if "stops its workers" in n], outcome.notes
    monkeypatch.setattr(ExitBarrier, "_hand_the_store_down", _not_handed_down)
    before = simulate(Schedule(1, 3, 2, 3, faults, failover=True))
    stopped = {n.split()[2] for n in before.notes if "stops its workers of round 0" in n}
    assert stopped == {"1:", "2:"}, before.notes  # (S7 skips an agent serving the store)


def test_a_second_stop_request_to_a_store_host_in_its_barrier_is_no_s7():
    """Seed 374 of every ``--failover`` kind: agent 0, the store's host, finishes, is
    SIGTERMed (it keeps the store up for the others), and SIGTERMed again 21 s later,
    which leaves at once, as asked. S7 judged that second request as a first."""
    kinds = (*AGENT_FAULTS, "join", "kill_guardian", "restart", "finish")
    schedule = schedule_for(374, kinds, failover=True)
    terms = [f for f in schedule.faults if f.kind == "term" and f.target == 0]
    assert len(terms) == 2
    assert simulate(schedule).violations == []


async def _forgets_nothing(self, current) -> bool:
    """The exit barrier before 2026-12-02 (the fourth change): a store that forgot us ends it."""
    return False


async def _carries_nothing(self, carried) -> None:
    """A rejoin before 2026-12-02 (the fourth change): no finished member carried."""


@pytest.mark.parametrize(
    ("faults", "off"),
    [
        ((Fault(36.18, "finish", 0), Fault(70.91, "restart", 1, 1.54)), "_store_forgot"),
        (
            (
                Fault(2.23, "finish", 0),
                Fault(35.76, "lose_host", 0),
                Fault(70.91, "restart", 1, 1.54),
            ),
            "carry_finished",
        ),
    ],
    ids=["in-its-barrier", "lost-before"],
)
def test_a_finished_member_is_counted_in_a_store_that_forgot_it(faults, off, monkeypatch):
    """Seed 2381 of every ``--failover`` kind, shrunk two ways: agent 0, the store's host,
    finishes and hands the store to agent 1, which is then SIGKILLed at work (and started
    again). The new store forgot round 0, and its fence waited a lease for agent 0, which
    was neither back nor gone there: agent 2 re-formed 20 s after the kill (S3: 3 s).
    Agent 0, still in its barrier, now sees the store forgot its round at once (a watch
    from before a move answers ``compacted``) and counts itself finished there, and stays
    in its barrier (it left, closing the run as succeeded while agent 2 worked on); where
    it was lost before, agent 2, whose round watch saw it finish, counts it finished as it
    joins the next round. The fence counts finished members: their workers hold no rank."""
    from agentd.rendezvous.sealing import Sealing

    schedule = Schedule(2381, 3, 1, 3, faults, failover=True)
    outcome = simulate(schedule)
    assert outcome.violations == [], outcome.notes
    rejoined = [at(n) for n in outcome.notes if "agent 2: round 1," in n]
    assert rejoined and rejoined[0] - 70.91 < 3.0, outcome.notes
    owner = ExitBarrier if off == "_store_forgot" else Sealing
    monkeypatch.setattr(
        owner, off, _forgets_nothing if off == "_store_forgot" else _carries_nothing
    )
    [violation] = simulate(schedule).violations
    assert violation.startswith("S3"), violation


def test_a_barrier_begun_after_the_store_forgot_the_round_counts_the_unseen_lost():
    """Seed 60963 of ``--failover`` with every kind: a member killed as round 0 (of
    three) was sealed, the store's host cut off a moment later, so the third member's
    store failed over empty before it had read the others' ids, and its exit barrier
    began there. The host came back, re-formed alone in round 1 and was SIGTERMed; the
    barrier, seeing no id to look at, waited for the killed member until its timeout (S5).
    A member that has not come back to the store within a heartbeat TTL of its forgetting
    is counted lost now."""
    schedule = schedule_for(60963, (*KINDS, "kill_guardian", "restart", "finish"), failover=True)
    drawn = [(f.kind, f.target) for f in schedule.faults]
    assert drawn[1:4] == [("kill", 1), ("partition", 0), ("finish", 2)], drawn  # as described
    outcome = simulate(schedule)
    assert outcome.violations == [], outcome.notes
