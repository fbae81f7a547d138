"""The membership protocol under seeded fault schedules, on a virtual clock.

See :mod:`tests.sim.world` for what is real and what is modelled. The seeds' violations
are pinned: each one below is a known gap of docs/protocol.md, found by this simulation
and not fixed yet. A change that fixes a gap removes its seeds here; a change that breaks
an invariant anywhere else fails, naming the seed (``python bench/simulate.py --seed N``
prints its schedule, the events and the fewest faults that still break it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time

import pytest

from agentd.rendezvous import barrier_state, exit_barrier
from agentd.rendezvous.barrier_leases import SuccessorLeases
from agentd.rendezvous.dynamic import DynamicRendezvous
from agentd.rendezvous.round_watch import RoundWatch
from agentd.rendezvous.rounds import Rounds
from agentd.store import amnesia
from tests.sim import world
from tests.sim.clock import START, Owner, run, spawn
from tests.sim.world import (
    GUARDIAN_START,
    KINDS,
    MORE_KINDS,
    Fault,
    Schedule,
    closing_schedule_for,
    schedule_for,
    shrink,
    simulate,
)

BATCH_TIMEOUT = pytest.mark.timeout(240)
"""For a test of many seeds: CPU-bound, about 7 s of CPU for 100 seeds alone; 25 s in the
suite on 2 cores, and past the suite's 60 s on a machine loaded three times over
(2026-12-03)."""

SEEDS = range(300)
CHUNK = 25
"""Seeds per test: each runs in a few seconds, even on a loaded machine."""

KNOWN_GAPS: dict[int, str] = {}
"""Seed -> the invariants it breaks today, each a known gap (none at present)."""


def test_the_virtual_loop_jumps_to_timers_holds_a_paused_owner_and_drops_a_dead_one():
    ticks: list[float] = []

    async def main(loop):
        agent = Owner("a")

        async def tick() -> None:
            while True:
                await asyncio.sleep(1.0)
                ticks.append(round(time.monotonic() - START, 6))

        spawn(agent, tick(), "tick")
        await asyncio.sleep(3.5)
        agent.paused = True  # SIGSTOP: the tick due at 4 s waits
        await asyncio.sleep(5)
        loop.resume(agent)  # SIGCONT at 8.5 s: it fires late, then every second
        await asyncio.sleep(1.2)
        agent.dead = True  # SIGKILL at 9.7 s
        await asyncio.sleep(100)
        return round(loop.time() - START, 6)

    began = time.perf_counter()
    assert run(main) == 109.7
    assert ticks == [1.0, 2.0, 3.0, 8.5, 9.5]
    assert time.perf_counter() - began < 5  # no real sleeping (a generous bound)


def test_a_task_spawned_as_its_owner_dies_is_closed_not_left_never_awaited():
    """A guardian's fence spawned in the instant its process was killed: its coroutine
    never starts, and a collection during the run warned of it (``never awaited``)."""

    async def fence() -> None:
        raise AssertionError("a dead process runs nothing")

    async def main(loop):
        guardian = Owner("g")
        task = spawn(guardian, fence(), "fence")
        guardian.dead = True
        await asyncio.sleep(1.0)
        return inspect.getcoroutinestate(task.get_coro())

    assert run(main) == inspect.CORO_CLOSED


def test_a_timeout_in_an_agents_task_ends_the_run_not_the_agent(monkeypatch):
    """pytest's timeout lands in whatever task runs. In an agent's, it ended that task
    alone, and the agent that looked dead broke S5 two virtual minutes later: a loaded
    machine's timeout read as a protocol's violation (2026-12-03)."""

    class Timeout(BaseException):  # pytest's is a BaseException too
        pass

    def late(*args):
        raise Timeout

    monkeypatch.setattr(world.World, "start_workers", late)
    with pytest.raises(Timeout):
        simulate(Schedule(0, 3, 2, 3, ()))


def test_a_schedule_gives_the_same_outcome_every_time():
    schedule = schedule_for(91)
    first, second = simulate(schedule), simulate(schedule)
    assert first.notes == second.notes
    assert first.requests == second.requests > 0


def test_a_schedule_gives_the_same_outcome_in_another_process():
    """Nothing in a run depends on the process: not string hashing, object addresses (the
    store's waiters wake in the order they came) nor the ids the code draws at random."""
    import subprocess
    import sys

    code = (
        "from tests.sim.world import simulate, schedule_for\n"
        "o = simulate(schedule_for(24))\n"
        "print(o.requests, len(o.notes), o.notes[-1])\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(hashed)},
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        for hashed in (0, 1)
    }
    assert len(outputs) == 1, outputs


def test_a_job_without_faults_forms_one_round_of_every_node():
    outcome = simulate(Schedule(0, 4, 2, 4, ()))
    assert outcome.violations == []
    assert outcome.rounds == 1
    assert sum("round 0, rank" in line for line in outcome.notes) == 4


def test_a_graceful_leave_re_forms_the_others_within_a_second():
    outcome = simulate(Schedule(0, 3, 2, 3, (Fault(10.0, "term", 1),)))
    assert outcome.violations == []
    restarted = [at(n) for n in outcome.notes if "round 1, rank" in n]
    assert len(restarted) == 2 and all(10.0 < t <= 11.0 for t in restarted), outcome.notes


@pytest.mark.parametrize("first", range(SEEDS.start, SEEDS.stop, CHUNK))
@BATCH_TIMEOUT
def test_the_seeds_break_no_invariant_beyond_the_known_gaps(first):
    seeds = range(first, min(first + CHUNK, SEEDS.stop))
    found = {}
    for seed in seeds:
        outcome = simulate(schedule_for(seed))
        if outcome.violations:
            found[seed] = "+".join(sorted({v.split(" ")[0] for v in outcome.violations}))
    known = {seed: gap for seed, gap in KNOWN_GAPS.items() if seed in seeds}
    assert found == known, {
        "new": {s: v for s, v in found.items() if known.get(s) != v},
        "gone": {s: v for s, v in known.items() if found.get(s) != v},
    }


@pytest.mark.parametrize("kind", ["term", "kill", "lose_host"])
def test_a_member_that_leaves_alone_costs_the_others_no_more_than_s3_allows(kind, monkeypatch):
    outcome = simulate(Schedule(1, 3, 2, 3, (Fault(10.0, kind, 1),)))
    assert outcome.violations == [], outcome.notes
    re_formed = min(at(n) for n in outcome.notes if "round 1, rank" in n)
    assert re_formed - 10.0 <= (3.0 if kind != "lose_host" else 15.0 + 2.0)
    monkeypatch.setattr(world, "LEAVE_BOUND", 0.01)  # the check itself can fail
    monkeypatch.setattr(world, "HOST_LOST_SLACK", -15.0)
    [violation] = simulate(Schedule(1, 3, 2, 3, (Fault(10.0, kind, 1),))).violations
    assert violation.startswith("S3") and f"left ({kind} at t=10.000s)" in violation


GUARDIAN_SEEDS = range(100)
"""Seeds drawn with a guardian's death among the faults (``MORE_KINDS``)."""


@BATCH_TIMEOUT
def test_seeds_with_a_guardians_death_break_no_invariant():
    kinds = (*KINDS, *MORE_KINDS)
    drawn = [schedule_for(seed, kinds) for seed in GUARDIAN_SEEDS]
    assert sum(f.kind == "kill_guardian" for s in drawn for f in s.faults) >= 20
    found = {s.seed: simulate(s).violations for s in drawn}
    assert {seed: v for seed, v in found.items() if v} == {}


FINISH_SEEDS = range(100)
"""Seeds drawn with workers that succeed among the faults (``MORE_KINDS``)."""


@BATCH_TIMEOUT
def test_seeds_with_workers_that_succeed_break_no_invariant():
    kinds = (*KINDS, "finish")
    drawn = [schedule_for(seed, kinds) for seed in FINISH_SEEDS]
    assert sum(f.kind == "finish" for s in drawn for f in s.faults) >= 20
    found = {s.seed: simulate(s).violations for s in drawn}
    assert {seed: v for seed, v in found.items() if v} == {}


CLOSING_SEEDS = range(100)
"""Jobs that end with spares beside them (``bench/simulate.py --closing``, S9)."""


@BATCH_TIMEOUT
def test_jobs_that_end_with_spares_break_no_invariant():
    drawn = [closing_schedule_for(seed) for seed in CLOSING_SEEDS]
    assert sum(s.nodes > s.max_nodes for s in drawn) == len(drawn)  # every one has spares
    found = {s.seed: simulate(s).violations for s in drawn}
    assert {seed: v for seed, v in found.items() if v} == {}


def _holds_s9_with_the_fix(
    schedule: Schedule, monkeypatch: pytest.MonkeyPatch, owner: type, name: str, before: object
) -> world.Outcome:
    """``schedule`` breaks no invariant, and breaks S9 with ``owner.name`` as it was
    before the fix (``before``): the check can fail. The outcome with the fix."""
    outcome = simulate(schedule)
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(owner, name, before)
    violations = simulate(schedule).violations
    assert violations and violations[0].startswith("S9"), violations
    return outcome


async def _leave_at_once(self: DynamicRendezvous) -> None:
    """As before 2026-12-04: nothing kept a store that took over lately up."""


async def _no_spares(self: Rounds) -> list[str]:
    """As before 2026-12-04: a spare serving the store told no other spare."""
    return []


def test_a_spare_serving_the_store_keeps_it_up_until_the_other_spares_read_the_close(
    monkeypatch,
):
    """Seed 40 of ``bench/simulate.py --closing``: agent 0 serves the store but is a spare
    (``--nnodes 1:1``, 5 agents); the member's worker succeeds and closes the run. The
    store's host, learning it, left at once with its store; the other spares failed over
    to an empty candidate, and one of them, alone enough for ``MIN``, ran the job again
    35 s later (round 1). It now keeps the store up until the last round's spares left."""
    schedule = Schedule(40, 5, 1, 1, (Fault(2.55, "finish", 2),), failover=True)
    outcome = _holds_s9_with_the_fix(schedule, monkeypatch, Rounds, "last_spare_ids", _no_spares)
    assert not rounds_of(outcome, 1), outcome.notes  # the job was not run again


async def _never_again(self: DynamicRendezvous) -> None:
    """As before 2026-12-04: a close written once, to a store the others left."""


def test_a_close_written_while_cut_off_is_written_again_where_the_others_went(monkeypatch):
    """Seed 2162 of ``bench/simulate.py --closing``, shrunk: the only member serves the
    store and is cut off for 4.5 s; its worker succeeds meanwhile, and it closes the run
    on its own store. The spares failed over to the next candidate, which lacks the close;
    once the fence of the forgotten round ended, one of them ran the job again. The
    member now writes the close again where the store it reaches lacks it."""
    faults = (Fault(6.57, "partition", 0, 4.5), Fault(8.07, "finish", 0))
    schedule = Schedule(2162, 3, 1, 1, faults, failover=True)
    fix = (DynamicRendezvous, "_close_again", _never_again)
    outcome = _holds_s9_with_the_fix(schedule, monkeypatch, *fix)
    assert not rounds_of(outcome, 1), outcome.notes  # the job was not run again


@pytest.mark.parametrize(
    ("seed", "nodes", "size", "faults"),
    [
        # the store's host frozen; the member fails over to its own candidate, closes the
        # run there and leaves before the spares, slower to fail over, read it
        (151, 4, 1, (Fault(1.778, "stop", 0, 19.67), Fault(4.468, "finish", 3))),
        # the store's host killed; the member re-forms on the next candidate, and closes
        # the run there before the spares registered again
        (115, 5, 1, (Fault(0.771, "join", 5), Fault(9.467, "kill", 0), Fault(9.737, "finish", 1))),
        # seed 1789 of --closing: the store's host, a member, cut off for 20 s; the others
        # fail over and end its round; it closes the run after the heal, and the agent then
        # serving the store, with no round, left before the last spare read the close
        (1789, 3, 2, (Fault(0.16, "partition", 0, 20.31), Fault(9.5, "finish", 0))),
    ],
    ids=["frozen-host", "killed-host", "cut-off-host"],
)
def test_a_run_closed_after_a_failover_reaches_every_spare(seed, nodes, size, faults, monkeypatch):
    """The closing store took over lately (it still fences the round it forgot, or lacks
    the member's round): the others may still be failing over to it. Its host left at
    once, and the spares promoted the next candidate, empty; one ran the job again, or
    waited out its join timeout. It now keeps the store up one heartbeat TTL
    (``leaving.py``'s ``_outlast_a_failover``)."""
    schedule = Schedule(seed, nodes, size, size, faults, failover=True)
    fix = (DynamicRendezvous, "_outlast_a_failover", _leave_at_once)
    _holds_s9_with_the_fix(schedule, monkeypatch, *fix)


@pytest.mark.parametrize(("kind", "duration"), [("term", 0.0), ("kill", 0.0), ("stop", 20.0)])
def test_a_member_that_leaves_or_freezes_in_its_exit_barrier_ends_no_round(
    kind, duration, monkeypatch
):
    """Seeds 303 and 368 of ``--kinds ...,finish`` (S7, before 2026-12-02), shrunk: agent
    1's worker succeeds, and in its exit barrier it is stopped, killed (its guardian
    releases it) or frozen past its lease. The others' round ended with it, and their
    workers were stopped mid-work. A member whose ``done`` key is set is no longer one
    whose leave or lost heartbeat ends the round."""
    faults = (Fault(5.0, "finish", 1), Fault(7.0, kind, 1, duration))
    outcome = simulate(Schedule(1, 3, 2, 3, faults))
    assert outcome.violations == [], outcome.notes
    assert any("agent 1: its worker succeeded" in n for n in outcome.notes), outcome.notes
    assert not rounds_of(outcome, 1), outcome.notes  # no round after the first
    monkeypatch.setattr(RoundWatch, "_lost", _lost_as_before)  # the check can fail
    [violation] = simulate(Schedule(1, 3, 2, 3, faults)).violations
    assert violation.startswith("S7") and f"met {kind} at t=7.000s" in violation, violation


@pytest.mark.parametrize("nodes", [2, 3])
def test_members_in_their_exit_barrier_leave_once_the_last_one_at_work_is_lost(nodes, monkeypatch):
    """Every member's worker succeeded but the last one's, whose host is then lost whole:
    no guardian marks it gone, and no member watches its heartbeat from its barrier. The
    others count it gone once its lease lapsed and leave (they waited forever here, where
    the barrier has no timeout; ``agentd run`` waits out ``--exit-barrier-timeout``)."""
    faults = (
        *(Fault(5.0, "finish", i) for i in range(nodes - 1)),
        Fault(7.0, "lose_host", nodes - 1),
    )
    outcome = simulate(Schedule(1, nodes, 1, nodes, faults))
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(SuccessorLeases, "look", _no_look)  # the check can fail
    [violation] = simulate(Schedule(1, nodes, 1, nodes, faults)).violations
    assert violation.startswith("S5") and "still wait in their exit barrier" in violation


@pytest.mark.parametrize(
    "faults",
    [
        # seed 5404, shrunk: the store restarted empty as agent 1's worker succeeded; agent
        # 0 re-formed round 1 alone, and was SIGTERMed 35 s later
        (
            Fault(35.0, "restart_store", -1, 14.07),
            Fault(35.0, "finish", 1),
            Fault(69.86, "term", 0),
        ),
        # seed 2967, shrunk: the same, the store restarted 13 s into agent 1's barrier
        (
            Fault(35.82, "finish", 1),
            Fault(49.13, "restart_store", -1, 14.38),
            Fault(50.7, "term", 0),
        ),
    ],
    ids=["5404", "2967"],
)
def test_a_barrier_leaves_once_the_round_the_others_re_formed_in_has_nobody_left(
    faults, monkeypatch
):
    """The others re-formed without the member in its exit barrier (its round forgotten by
    a store restarted empty; a worker's failure would do the same), then left too: nobody
    can finish the job, and the barrier waited forever here (``agentd run``: until
    ``--exit-barrier-timeout``, 300 s), since it judged its own round alone, whose next
    round someone had joined. It now judges the round they re-formed in as well."""
    outcome = simulate(Schedule(1, 2, 1, 3, faults))
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(barrier_state, "later_round_left", _none_left_later)
    [violation] = simulate(Schedule(1, 2, 1, 3, faults)).violations
    assert violation.startswith("S5") and "still wait in their exit barrier" in violation


def test_a_barrier_leaves_once_the_arrivals_at_a_round_nobody_else_can_fill_are_gone(
    monkeypatch,
):
    """Seed 4113, shrunk (``--nnodes 2:2``): agent 0's worker succeeds; the store restarts
    empty; agent 1, at work, is back at round 1 in the new store, which only agent 0 (done)
    could fill, and is killed there. An agent between rounds leaves its guardian no will,
    and the round never seals: agent 0 waited for its barrier timeout, since somebody was
    at the next round. It now looks at that round's arrivals' heartbeats, and leaves a
    heartbeat TTL after the last one lapsed."""
    faults = (Fault(3.45, "finish", 0), Fault(3.45, "restart_store"), Fault(4.59, "kill", 1))
    outcome = simulate(Schedule(1, 2, 2, 2, faults))
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(barrier_state.Arrivals, "all_gone", _never_all_gone)
    [violation] = simulate(Schedule(1, 2, 2, 2, faults)).violations
    assert violation.startswith("S5") and "still wait in their exit barrier" in violation


def test_a_barrier_in_a_store_that_forgot_the_round_counts_a_lost_member_gone(monkeypatch):
    """Seed 7989, shrunk (``--nnodes 2:2``): agent 0's host is lost whole, and agent 1's
    worker succeeds as the store restarts empty, before its lease lapsed. The new store
    holds neither the round's entries nor agent 0's lease, so the barrier's look at its
    successors' leases had nothing to read, and it waited for its timeout. It now looks at
    the successors its round watch read, and counts agent 0 gone once its heartbeat has
    been missing from the new store for a heartbeat TTL."""
    faults = (
        Fault(2.24, "lose_host", 0),
        Fault(9.33, "finish", 1),
        Fault(9.33, "restart_store", -1, 12.56),
    )
    outcome = simulate(Schedule(1, 2, 2, 2, faults))
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(exit_barrier, "round_state", _forgotten_round_not_judged)
    [violation] = simulate(Schedule(1, 2, 2, 2, faults)).violations
    assert violation.startswith("S5") and "still wait in their exit barrier" in violation


def test_a_barrier_judges_the_arrivals_at_a_round_that_ended_unsealed(monkeypatch):
    """Seed 8554, shrunk (``--nnodes 2:2``): agent 1's worker succeeds; the store restarts
    empty; agent 0, back at round 1 in the new store, is SIGTERMed there, which ends round
    1 unsealed, and nobody comes to round 2. The barrier looked at round 2's arrivals
    alone (none) and waited for its timeout; it now judges round 1's as well."""
    faults = (
        Fault(37.97, "finish", 1),
        Fault(48.89, "restart_store", -1, 16.24),
        Fault(65.73, "term", 0),
    )
    outcome = simulate(Schedule(1, 2, 2, 2, faults))
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(barrier_state.Arrivals, "all_gone", _never_all_gone)
    [violation] = simulate(Schedule(1, 2, 2, 2, faults)).violations
    assert violation.startswith("S5") and "still wait in their exit barrier" in violation


async def _forgotten_round_not_judged(
    store, keys, gen, size, arrivals=None, forgotten=False, unseen_lost=False
):
    """The exit barrier until late on 2026-12-02: no look at the leases in a store that
    forgot the round (nor, from 2026-12-03, at the members not back to it)."""
    return await barrier_state.round_state(store, keys, gen, size, arrivals)


async def _never_all_gone(self, ours, size, gen, accounted) -> bool:
    """The exit barrier before 2026-12-02, late: a next round's arrivals never judged."""
    return False


async def _none_left_later(store, keys, rounds) -> None:
    """The exit barrier before 2026-12-02, late: its own round judged alone."""
    return None


async def _no_look(self, now: float) -> tuple[int, bool]:
    """The exit barrier before 2026-12-02, later: no look at the leases."""
    return 0, False


async def _lost_as_before(self, key: str, members: dict[str, str]) -> str:
    """The round watch before 2026-12-02: any watched heartbeat gone ends the round."""
    why = f"node {members[key]} left"
    await self.end_round(why)
    return why


def test_a_guardian_dead_as_its_agent_freezes_leaves_its_twin_to_fence_the_workers():
    """Seeds 1941, 3255, 4736, 6185 and 8717 of ``--kinds ...,kill_guardian``, shrunk: the
    guardian dies as its agent freezes, so the agent starts no new one. Its twin stands
    in and kills the workers at the lease's end, before the others re-form over their
    ranks (before the twin, nothing did: S1). A twin that dies too, standing in, leaves
    its own twin to do it (before, three faults broke S1: the guardian, its twin, a
    freeze)."""
    same_time = (Fault(5.0, "kill_guardian", 0), Fault(5.0, "stop", 0, 25.0))
    outcome = simulate(Schedule(1, 3, 2, 3, same_time))
    assert outcome.violations == [], outcome.notes
    assert any("guardian0's twin stands in" in n for n in outcome.notes), outcome.notes
    assert any("guardian 0 kills the workers at the lease's end" in n for n in outcome.notes)
    both = (*same_time, Fault(5.0, "kill_guardian", 0))
    outcome = simulate(Schedule(1, 3, 2, 3, both))
    assert outcome.violations == [], outcome.notes
    assert any("twin0's twin stands in" in n for n in outcome.notes), outcome.notes
    assert any("guardian 0 kills the workers at the lease's end" in n for n in outcome.notes)
    later = 5.0 + GUARDIAN_START + 0.05  # frozen once the agent started a new guardian
    replaced = (Fault(5.0, "kill_guardian", 0), Fault(later, "stop", 0, 25.0))
    outcome = simulate(Schedule(1, 3, 2, 3, replaced))
    assert outcome.violations == [], outcome.notes
    assert any("guardian 0 kills the workers at the lease's end" in n for n in outcome.notes)


@pytest.mark.parametrize("seed", [111, 347])
def test_agents_waiting_through_a_store_restart_read_it_as_one_and_join_anew(seed):
    """Seeds 111 and 347 (S5, before the simulated client was faithful): agents wait in a
    round while the store restarts empty, one of them paused or cut off. As the HTTP
    client does, its watch from the old store's revision answers ``compacted`` on the new
    one, so it joins the new store's round instead of waiting for ever in a round the new
    store never had; the job forms one round of every agent."""
    outcome = simulate(schedule_for(seed))
    assert outcome.violations == []
    assert len(rounds_of(outcome, 0)) == outcome.schedule.nodes + sum(
        f.kind == "join" for f in outcome.schedule.faults
    ), outcome.notes


def test_a_round_the_store_forgot_before_its_last_call_is_joined_anew_not_sealed_empty():
    """Seed 1260: a store restarted while an agent waited for a round's last call; at the
    last call the round's arrival count read 0 and the agent sealed a round of no member,
    dying of a ValueError. It now joins the next round, and the job goes on."""
    outcome = simulate(schedule_for(1260))
    assert outcome.violations == []
    assert outcome.rounds >= 1


def test_a_failing_schedule_shrinks_to_the_faults_that_break_it():
    """Shrinking keeps only the faults a failure needs: of seed 91's four, agent 1's
    guardian kills its workers at its lease's end for one alone, the 15.3 s SIGSTOP."""
    schedule = schedule_for(91)

    def fails(candidate: Schedule) -> bool:
        return any("guardian 1 kills" in note for note in simulate(candidate).notes)

    assert fails(schedule) and len(schedule.faults) == 4
    smallest = shrink(schedule, fails)
    assert [f.kind for f in smallest.faults] == ["stop"], smallest.describe()


def test_a_store_that_forgot_the_run_seals_no_round_while_a_forgotten_member_may_run():
    """Seed 91 (S1): agent 1 is SIGSTOPped as the store restarts empty and a spare
    arrives. The new store knew no lease, so the spare and agent 0 formed a round at once
    and the spare took rank 1 while agent 1's worker held it. Agent 0 now tells the new
    store the round it forgot (``ctl/forgotten``), and the round waits until agent 1's
    lease has ended and its guardian has killed the worker."""
    outcome = simulate(schedule_for(91))
    assert outcome.violations == []
    killed = next(n for n in outcome.notes if "guardian 1 kills" in n)
    started = [n for n in outcome.notes if ": round 1, rank" in n]
    assert len(started) == 2, outcome.notes
    assert all(at(n) >= at(killed) for n in started), outcome.notes


def at(note: str) -> float:
    """The virtual time of a note (``t=12.345s ...``)."""
    return float(note.split("s ", 1)[0][2:])


def rounds_of(outcome, generation: int) -> list[str]:
    """``agent N: rank R of W`` for each agent that started workers of round ``generation``."""
    marker = f": round {generation}, "
    return [n.split("s ", 1)[1].replace(marker, " ") for n in outcome.notes if marker in n]


def test_an_arrival_that_dies_before_the_seal_ends_its_round_instead_of_joining_it():
    """Seed 7 (S2): agent 1 joins the first round and is SIGKILLed before it is sealed
    (no will yet). At the last call its heartbeat is gone: the round ends unsealed, and
    the others form the next one without it, never with a member whose lease is dead."""
    outcome = simulate(schedule_for(7))
    assert outcome.violations == []
    assert rounds_of(outcome, 0) == []
    members = rounds_of(outcome, 1)
    assert len(members) == 3 and all(m.endswith("of 3") for m in members), outcome.notes
    assert not any(m.startswith("agent 1 ") for m in members)


def test_spares_wait_for_the_workers_of_a_member_cut_off_from_the_store():
    """Seed 145 (S1): a member leaves, another is partitioned as two spares arrive. The
    next round reaches MAX with the spares at once, but it is sealed only once the cut-off
    member's workers cannot run (its lease lapsed and the fence passed)."""
    assert simulate(schedule_for(145)).violations == []


def test_an_agent_paused_as_it_first_sets_its_heartbeat_joins_with_a_fresh_lease():
    """Seed 8: agent 2 is SIGSTOPped for 20 s as its first heartbeat is sent, longer than
    the lease that heartbeat gave. Its answer came after the pause, the round was sealed
    with it, and it ended that round at once (its lease had run out): a restart of the
    job for nothing. A heartbeat answered more than an interval after its send is now set
    again, so it joins with a fresh lease: one round of all four."""
    outcome = simulate(schedule_for(8))
    assert outcome.violations == []
    assert outcome.rounds == 1, outcome.notes


@pytest.mark.parametrize("seed", [221, 1193])
def test_an_agent_paused_or_cut_off_as_its_round_seals_ends_that_round(seed):
    """Seeds 221 and 1193, and 8 until its heartbeat was set again (above) (S1, S5): an
    agent SIGSTOPped or partitioned as its round is sealed comes back past its lease, or
    to a store that expired (or, restarted, forgot) its heartbeat meanwhile. It starts no
    worker of that round (the others may have its ranks by now) and ends it, so the job
    re-forms with it rather than waiting on it for ever."""
    outcome = simulate(schedule_for(seed))
    assert outcome.violations == []
    assert outcome.rounds >= 2


def test_a_member_paused_through_its_round_marks_itself_out_of_it_as_it_comes_back():
    """Seed 1963 (S5): agent 2 is SIGSTOPped as round 1 is sealed with it, and the round
    ends without it while it sleeps. It never saw the seal, so it did not know it was a
    member; it waited as a spare without writing ``out``, and the next round's sealer
    fenced on it for ever. It now reads the seal of the round it waited in and marks
    itself out, and the job re-forms with all three."""
    outcome = simulate(schedule_for(1963))
    assert outcome.violations == []
    assert len(rounds_of(outcome, 2)) == 3, outcome.notes


def test_spares_beside_a_full_round_whose_hosts_are_all_lost_form_the_next_one():
    """Seed 1397 of the schedules without store restarts (S5): two spares wait beside a
    full round of two; both its hosts are lost at once, so no member is left to end it.
    The spares now check the full round's members while they wait, end it once one is
    gone, and form the next round themselves."""
    kinds = tuple(k for k in KINDS if k != "restart_store")
    outcome = simulate(schedule_for(1397, kinds))
    assert outcome.violations == []
    assert sorted(rounds_of(outcome, 1)) == ["agent 2 rank 0 of 2", "agent 3 rank 1 of 2"]


@pytest.mark.parametrize("seed", [2306, 5941, 7053, 8648])
def test_a_seal_resent_to_a_store_restarted_empty_is_refused(seed):
    """Seeds 2306, 5941, 7053 and 8648 (S2): an agent read its round's arrivals, the store
    restarted empty, and the seal, resent as a reset connection is, sealed the new
    store's round of the same number with arrivals whose leases it never held. The seal
    now names their heartbeats, and a store that lacks one refuses it."""
    assert simulate(schedule_for(seed)).violations == []


@pytest.mark.parametrize("seed", [8686, 9138])
def test_a_timer_held_by_a_paused_agent_and_cancelled_after_its_resume_never_runs(seed, caplog):
    """Seeds 8686 and 9138: the simulated loop re-queued a paused agent's held timer as
    it resumed and ran it even when ``asyncio.timeout`` cancelled it before its turn
    (``Timeout._on_timeout`` then failed its own assertion). Nothing is logged now."""
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        simulate(schedule_for(seed))
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_leave_after_a_peer_closed_the_run_as_succeeded_is_not_judged_a_stall():
    """Seed 975 of every kind (no failover): agent 2 finishes, is cut off in its barrier
    until its lease lapses, and then closes the run as succeeded, as ``agentd run`` does;
    the others, at work, leave as they finish from then on, so agent 3's restart 33 s
    later re-forms nothing. S3 expected a new round within 3 s."""
    kinds = (*KINDS, *MORE_KINDS)
    schedule = schedule_for(975, kinds, False)
    assert [f.kind for f in schedule.faults if f.target == 2][:2] == ["finish", "partition"]
    assert simulate(schedule).violations == []


@pytest.mark.parametrize(
    "seed, min_nodes, faults",
    [
        pytest.param(
            3096,
            2,
            (
                Fault(1.582, "join", 2),
                Fault(1.582, "join", 3),
                Fault(1.582, "restart_store", -1, 13.551),
            ),
            id="3096-new-nodes-as-it-restarts",
        ),
        pytest.param(
            7280,
            1,
            (
                Fault(11.096, "partition", 1, 11.696),
                Fault(11.206, "restart", 0, 1.483),
                Fault(11.206, "restart_store", -1, 8.661),
                Fault(20.127, "join", 3),
            ),
            id="7280-a-member-cut-off-meanwhile",
        ),
    ],
)
def test_new_nodes_at_a_store_restarted_empty_wait_for_the_leases_it_granted(
    monkeypatch, seed, min_nodes, faults
):
    """Seeds 3096 and 7280, shrunk: the store restarts empty while a round's workers run,
    and new nodes reach it before any member of that round (3096: in the same instant;
    7280: 9 s later, the one member left cut off all that time). They knew no round to
    fence and sealed one there at once, beside the old workers (S1). The store now tells
    them how long ago its previous self held leases (``agentd.store.amnesia``), and their
    first round waits until a lease of that time has ended, or a member is back."""
    outcome = simulate(Schedule(seed, 2, min_nodes, 2, faults))
    assert outcome.violations == [], outcome.notes
    monkeypatch.setattr(amnesia, "tell", _says_nothing)
    [violation] = simulate(Schedule(seed, 2, min_nodes, 2, faults)).violations
    assert violation.startswith("S1"), violation


async def _says_nothing(*args: object, **kwargs: object) -> None:
    """A restarted store that tells its clients nothing (the code before)."""
