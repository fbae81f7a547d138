"""The monitor, on a clock the tests move (deadlines are plain arithmetic on it); one test
lets the loop's own timer fire. End-to-end with real workers: tests/integration/test_hangs.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentd.heartbeats.monitor import ProgressMonitor, Silence
from agentd.heartbeats.settings import START, STEP, HeartbeatSettings
from agentd.heartbeats.stragglers import StepTimes
from agentd.heartbeats.timeouts import RESUME_FLOOR, LearnedTimeouts
from agentd.wire.progress import ProgressMessage
from tests.heartbeats.fakes import make_monitor, msg


async def test_intervals_are_learned_per_level_and_deadlines_follow_the_section():
    monitor, clock, _, _ = make_monitor(HeartbeatSettings(initial_timeout=100.0, min_timeout=0.1))
    monitor.watch({0: 100}, {0: 0})
    t = clock.now
    assert monitor.next_deadline() == t + 100.0  # before any message: the initial timeout
    feed = []
    for step in range(1, 11):  # ten steps of 0.2 s
        feed.append((0, msg("beat", step, t + 0.2 * step)))
    feed.append((0, msg("enter", 10, t + 2.1, "ckpt")))  # 0.1 s of the step, then the section
    feed.append((0, msg("exit", 10, t + 5.1, "ckpt")))
    clock.now = t + 5.1
    monitor.feed(feed)
    timeouts = monitor.timeouts
    assert timeouts.timeout(STEP).samples == 10  # every interval spent outside sections
    assert timeouts.timeout("ckpt").samples == 1
    assert timeouts.timeout(STEP).seconds == pytest.approx(0.4)
    assert monitor.next_deadline() == pytest.approx(t + 5.1 + 0.4)
    clock.now = t + 5.2
    monitor.feed([(0, msg("enter", 10, t + 5.2, "ckpt"))])
    assert monitor.next_deadline() == pytest.approx(t + 5.2 + 100.0)  # ckpt: not learned yet
    monitor.unwatch()


async def test_a_worker_that_never_heartbeats_is_held_to_the_initial_timeout_once_watched():
    monitor, clock, _, _ = make_monitor()
    monitor.watch({0: 100, 1: 101}, {0: 0, 1: 1})
    assert monitor.next_deadline() is None  # nobody heartbeats: not an instrumented job
    monitor.feed([(0, msg("beat", 1, clock.now))])
    assert monitor.next_deadline() == clock.now + 600.0  # rank 1's start + the default
    clock.now += 500
    monitor.feed([(0, msg("beat", 2, clock.now))])
    clock.now += 101
    silent = {s.local_rank: s for s in monitor.silences()}
    assert silent[1].overdue and silent[1].last_progress is None
    assert not silent[0].overdue  # its step timeout is still the initial one
    monitor.unwatch()


async def test_done_workers_are_not_watched_until_they_speak_again():
    monitor, clock, _, _ = make_monitor(HeartbeatSettings(step_timeout=5.0))
    monitor.watch({0: 100}, {0: 0})
    monitor.feed([(0, msg("beat", 1, clock.now)), (0, msg("done", 1, clock.now))])
    assert monitor.next_deadline() is None
    monitor.feed([(0, msg("beat", 2, clock.now))])
    assert monitor.next_deadline() == clock.now + 5.0
    monitor.unwatch()


async def test_a_parked_worker_is_not_watched_and_its_park_is_no_sample():
    """A park (an in-process restart) interrupts a step, often long after it began (a
    failure elsewhere had to be seen first): that interval says nothing of a step's time."""
    monitor, clock, _, _ = make_monitor(HeartbeatSettings(min_timeout=0.1))
    monitor.watch({0: 100, 1: 101}, {0: 0, 1: 1})
    t = clock.now
    monitor.feed([(r, msg("beat", 1, t)) for r in (0, 1)])
    clock.now = t + 30.0
    monitor.feed([(0, msg("parked", 1, clock.now))])
    assert monitor.timeouts.timeout(STEP).samples == 0
    assert [s.local_rank for s in monitor.silences()] == [1]  # rank 0 is judged no more
    monitor.unwatch()


async def test_the_loop_timer_fires_once_at_the_deadline_with_every_workers_silence():
    hangs: list[list[Silence]] = []
    timeouts = LearnedTimeouts(HeartbeatSettings(step_timeout=0.2))
    monitor = ProgressMonitor(
        timeouts, StepTimes(2, 5, lambda s: None), hangs.append, lambda lr: True
    )
    loop = asyncio.get_running_loop()
    monitor.watch({0: 100, 1: 101}, {0: 0, 1: 1})
    monitor.feed([(0, msg("beat", 1, loop.time())), (1, msg("beat", 1, loop.time()))])
    async with asyncio.timeout(10):
        while not hangs:
            await asyncio.sleep(0.02)
            monitor.feed([(1, msg("beat", 2, loop.time()))])  # rank 1 keeps going
    [silences] = hangs
    by_rank = {s.local_rank: s for s in silences}
    assert by_rank[0].overdue and not by_rank[1].overdue
    assert by_rank[0].silent_for >= 0.2
    await asyncio.sleep(0.3)
    assert len(hangs) == 1  # once per attempt
    monitor.unwatch()


async def test_messages_waiting_when_the_timer_fires_are_read_before_judging():
    """A loop that ran late (a stall, a busy moment) must not take progress it has not
    read yet for silence: the timer reads the pipe first."""
    hangs: list[list[Silence]] = []
    waiting: list[tuple[int, ProgressMessage]] = []
    timeouts = LearnedTimeouts(HeartbeatSettings(step_timeout=0.2))

    def drain() -> None:
        monitor.feed(list(waiting))
        waiting.clear()

    monitor = ProgressMonitor(
        timeouts, StepTimes(2, 5, lambda s: None), hangs.append, lambda lr: True, drain=drain
    )
    loop = asyncio.get_running_loop()
    monitor.watch({0: 100}, {0: 0})
    monitor.feed([(0, msg("beat", 1, loop.time()))])
    time.sleep(0.3)  # noqa: ASYNC251 (the loop stalls past the deadline; the worker goes on)
    waiting.append((0, msg("beat", 2, loop.time())))
    await asyncio.sleep(0.05)
    assert hangs == [] and waiting == []
    monitor.unwatch()


async def test_step_times_and_stragglers_come_from_the_beats():
    monitor, clock, _, stragglers = make_monitor()
    monitor.watch({0: 100, 1: 101, 2: 102}, {0: 10, 1: 11, 2: 12})
    t = clock.now
    feed = []
    for step in range(0, 8):
        feed += [
            (0, msg("beat", step, t + 1.0 * step)),
            (1, msg("beat", step, t + 1.0 * step)),
            (2, msg("beat", step, t + 2.0 * step)),
        ]
    clock.now = t + 20
    monitor.feed(feed)
    [slow] = stragglers
    assert (slow.rank, slow.series, slow.ratio, slow.steps) == (12, "step", 2.0, 3)
    status = {w["local_rank"]: w for w in monitor.status()}
    assert status[2]["times"]["step"]["vs_median"] == 2.0
    assert status[2]["times"]["step"]["straggler"] is True
    assert status[0]["times"]["step"]["straggler"] is False
    histograms = {(lr, name): count for lr, _, name, _, _, count in monitor.step_times.histograms()}
    assert histograms[(0, "step")] == 7
    monitor.unwatch()


async def test_a_drains_hold_judges_no_silence_and_learns_nothing_from_it():
    """A drain pauses every rank at its step and has it checkpoint, while other nodes'
    ranks wait on them in a collective: with a learned 2 s timeout, a pause of a few
    seconds (a node slow to tell its workers) had the paused ranks killed as hung, and the
    drain meant to save the job failed it."""
    monitor, clock, _, _ = make_monitor(HeartbeatSettings(step_timeout=2.0))
    monitor.watch({0: 100, 1: 101}, {0: 0, 1: 1})
    t = clock.now
    monitor.feed([(0, msg("beat", 1, t)), (1, msg("beat", 1, t))])
    monitor.feed([(0, msg("drain", 1, t + 0.1))])  # rank 0 pauses; rank 1 waits on it
    monitor.hold(70.0)
    clock.now = t + 30
    assert not any(s.overdue for s in monitor.silences())
    assert monitor.next_deadline() == pytest.approx(t + 70 + 2.0)
    monitor.feed([(0, msg("saved", 2, clock.now))])
    monitor.hold(None)  # the drain is over: silences count from now
    assert monitor.next_deadline() == pytest.approx(clock.now + 2.0)
    samples = monitor.timeouts.timeout(STEP).samples
    monitor.feed([(1, msg("beat", 2, clock.now + 0.2))])  # its interval spans the hold
    assert monitor.timeouts.timeout(STEP).samples == samples
    clock.now += 2.5
    assert {s.local_rank for s in monitor.silences() if s.overdue} == {0, 1}
    monitor.unwatch()


async def test_the_beats_due_are_the_heartbeating_workers_deadlines_whatever_the_hold():
    """What a drain waits for its workers' steps: each worker that heartbeats beats again
    before its deadline unless it is hung; one that never did is not waited for."""
    monitor, clock, _, _ = make_monitor(HeartbeatSettings(step_timeout=2.0))
    monitor.watch({0: 100, 1: 101}, {0: 0, 1: 1})
    t = clock.now
    assert monitor.beats_due_in() is None  # nobody heartbeats yet
    monitor.feed([(0, msg("beat", 1, t)), (1, msg("enter", 1, t - 0.5, "compute"))])
    clock.now = t + 0.5
    assert monitor.beats_due_in() == pytest.approx(600.0 - 1.0)  # compute: not learned yet
    monitor.feed([(1, msg("done", 1, clock.now))])
    assert monitor.beats_due_in() == pytest.approx(1.5)  # rank 0's step
    monitor.hold(70.0)  # a drain's: the workers beat as they did
    assert monitor.beats_due_in() == pytest.approx(1.5)
    clock.now = t + 5
    assert monitor.beats_due_in() == 0.0  # overdue
    monitor.unwatch()


async def test_a_check_that_runs_late_counts_silences_from_then():
    """The agent itself did not run past a worker's deadline (frozen, starved): a rank
    that waited meanwhile on another node's drain was judged hung at the thaw, before the
    agent could read the drain's request. Silences count from the late check; a check on
    time judges."""
    monitor, clock, hangs, _ = make_monitor(HeartbeatSettings(step_timeout=2.0))
    monitor.watch({0: 100}, {0: 0})
    t = clock.now
    monitor.feed([(0, msg("beat", 1, t))])
    assert monitor.next_deadline() == t + 2.0
    clock.now = t + 6.0  # the timer fires 4 s late
    monitor._fire()
    assert hangs == [] and monitor.next_deadline() == t + 8.0
    clock.now = t + 8.1
    monitor._fire()
    assert [s.overdue for s in hangs[0]] == [True]
    monitor.unwatch()


async def test_an_agent_late_at_every_check_still_judges_at_the_second():
    monitor, clock, hangs, _ = make_monitor(HeartbeatSettings(step_timeout=2.0))
    monitor.watch({0: 100}, {0: 0})
    t = clock.now
    monitor.feed([(0, msg("beat", 1, t))])
    for late_by, judged in ((4.0, False), (4.0, True)):
        deadline = monitor.next_deadline()
        assert deadline is not None
        clock.now = deadline + late_by
        monitor._fire()
        assert bool(hangs) == judged
    monitor.unwatch()


async def test_a_rank_resumed_in_process_is_held_to_the_starts_seen_not_the_initial_timeout():
    """Seed 5 of ``bench/bench_chaos.py --stragglers --inprocess``: a worker was stopped
    as the ranks kept by an in-process restart resumed, before their first heartbeat;
    they waited for it in ``init_process_group``, and the agent held them to the initial
    timeout (600 s) as if they were new processes importing torch."""
    monitor, clock, _, _ = make_monitor()
    monitor.watch({0: 100, 1: 101}, {0: 0, 1: 1})
    t = clock.now
    clock.now = t + 4
    dumps = msg("beat", 1, t + 3)._replace(dump_signal=10)  # rank 0 can dump its stacks
    monitor.feed([(0, dumps), (1, msg("beat", 1, t + 4)._replace(dump_signal=10))])
    assert monitor.timeouts.timeout(START).samples == 2  # two new workers' starts
    monitor.unwatch()
    t = clock.now = t + 10
    monitor.watch({0: 100, 1: 202}, {0: 0, 1: 1}, resumed={0})  # rank 1 is a new process
    assert monitor.next_deadline() == t + RESUME_FLOOR  # 2 x 4 s is under the floor
    clock.now = t + RESUME_FLOOR + 0.1
    silent = {s.local_rank: s for s in monitor.silences()}
    assert silent[0].overdue and silent[0].resumed
    assert silent[0].timeout.source == "learned"
    assert silent[0].dump_signal == 10  # its process registered it in the attempt before
    assert not silent[1].overdue and not silent[1].resumed  # a new one: the initial 600 s
    assert silent[1].dump_signal == 0
    monitor.feed([(0, msg("beat", 1, clock.now)), (1, msg("beat", 1, clock.now))])
    assert monitor.timeouts.timeout(START).samples == 3  # a resumed rank's wait is no start
    monitor.unwatch()


async def test_a_start_that_spans_a_drains_hold_is_no_sample():
    monitor, clock, _, _ = make_monitor()
    monitor.watch({0: 100}, {0: 0})
    monitor.hold(20.0)
    clock.now += 25
    monitor.feed([(0, msg("beat", 1, clock.now))])
    assert monitor.timeouts.timeout(START).samples == 0
    monitor.unwatch()
