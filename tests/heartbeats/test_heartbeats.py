"""Hang detection's parts: the wire, learned timeouts, the monitor, stragglers, the verdict.

The monitor runs on a clock the tests move (deadlines are plain arithmetic on it); one
test lets the loop's own timer fire. End-to-end behaviour with real workers is in
tests/integration/test_hangs.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agentd.heartbeats.monitor import ProgressMonitor, Silence
from agentd.heartbeats.settings import STEP, HeartbeatSettings
from agentd.heartbeats.stacks import StackDump, parse_faulthandler, parse_py_spy
from agentd.heartbeats.stragglers import StepTimes, Straggler
from agentd.heartbeats.timeouts import MIN_SAMPLES, LearnedTimeouts, Timeout
from agentd.heartbeats.verdict import judge
from agentd.heartbeats.wire import ProgressMessage, encode
from agentd.timer.file_pipe import BadRequest, parse_line, parse_request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def msg(kind: str, steps: int, at: float, section: str | None = None) -> ProgressMessage:
    return ProgressMessage(pid=100, kind=kind, steps=steps, at=at, section=section)


def make_monitor(settings: HeartbeatSettings | None = None, path: Path | None = None):
    clock = Clock()
    hangs: list[list[Silence]] = []
    stragglers: list[Straggler] = []
    timeouts = LearnedTimeouts(settings or HeartbeatSettings(), path)
    times = StepTimes(1.5, 3, stragglers.append)
    monitor = ProgressMonitor(timeouts, times, hangs.append, lambda lr: True, clock)
    return monitor, clock, hangs, stragglers


# -- the wire ------------------------------------------------------------------------------


def test_progress_messages_round_trip_on_the_timer_pipe_wire():
    line = encode("enter", 42, 7, 123.25, 'check"point', dump_signal=39)
    assert line.endswith(b"\n")
    parsed = parse_request(line.rstrip(b"\n"))
    assert parsed == ProgressMessage(42, "enter", 7, 123.25, 'check"point', 39)
    assert parse_request(encode("beat", 42, 8, 124.0).rstrip()) == ProgressMessage(
        42, "beat", 8, 124.0
    )


@pytest.mark.parametrize(
    ("doc", "rule"),
    [
        ({"kind": "nap"}, "kind: 'nap' must be one of beat, enter, exit, done"),
        ({"pid": 0}, "pid: 0 must be a positive integer"),
        ({"steps": -1}, "steps: -1 must be an integer"),
        ({"steps": 2**60}, "steps: 1152921504606846976 must be an integer"),
        ({"at": "soon"}, "at: 'soon' must be a finite number"),
        ({"at": float("nan")}, "at: nan must be a finite number"),
        ({"kind": "enter"}, "section: None must be a non-empty string"),
        ({"kind": "exit", "section": "x" * 200}, "section: 'xxx"),
        ({"section": "a"}, "section: only enter and exit messages name one, not beat"),
        ({"dump_signal": 4096}, "dump_signal: 4096 must be a signal number"),
    ],
)
def test_bad_progress_messages_name_the_field_and_rule(doc, rule):
    base = {"version": 2, "kind": "beat", "pid": 42, "steps": 1, "at": 5.0}
    with pytest.raises(BadRequest) as info:
        parse_request(json.dumps({**base, **doc}).encode())
    assert str(info.value).startswith(rule)


def test_a_progress_message_glued_to_a_partial_line_survives():
    line = b'{"version": 1, "pid": 12' + encode("beat", 42, 3, 9.5).rstrip()
    message, problem = parse_line(line)
    assert message == ProgressMessage(42, "beat", 3, 9.5)
    assert problem is not None and "stray bytes" in problem


# -- learned timeouts ----------------------------------------------------------------------


def test_the_initial_timeout_holds_until_enough_intervals_then_the_learned_one():
    timeouts = LearnedTimeouts(HeartbeatSettings(initial_timeout=30.0, min_timeout=0.5))
    for _ in range(MIN_SAMPLES - 1):
        timeouts.observe(STEP, 1.0)
    assert timeouts.timeout(STEP) == Timeout(30.0, "initial", MIN_SAMPLES - 1)
    timeouts.observe(STEP, 1.2)
    learned = timeouts.timeout(STEP)
    assert (learned.source, learned.observed, learned.seconds) == ("learned", 1.2, 2.4)


def test_a_learned_timeout_is_a_high_quantile_times_the_factor_never_below_the_floor():
    settings = HeartbeatSettings(safety_factor=3.0, min_timeout=2.0)
    timeouts = LearnedTimeouts(settings)
    for i in range(200):
        timeouts.observe(STEP, 0.1 if i % 100 else 0.5)  # two slow ones among 200: 1%
    assert timeouts.timeout(STEP).observed == 0.1  # p99 of 200 is the 198th smallest
    timeouts.observe(STEP, 0.5)  # a third slow one: now more than 1%
    assert timeouts.timeout(STEP).observed == 0.5
    assert timeouts.timeout(STEP).seconds == 2.0  # 1.5 s is under the floor
    for _ in range(200):
        timeouts.observe("checkpoint", 4.0)
    assert timeouts.timeout("checkpoint").seconds == 12.0


def test_flags_override_what_is_learned():
    settings = HeartbeatSettings(step_timeout=9.0, section_timeouts={"eval": 60.0})
    timeouts = LearnedTimeouts(settings)
    for _ in range(50):
        timeouts.observe(STEP, 1.0)
        timeouts.observe("eval", 1.0)
        timeouts.observe("save", 1.0)
    assert timeouts.timeout(STEP).source == "explicit"
    assert timeouts.timeout(STEP).seconds == 9.0
    assert timeouts.timeout("eval").seconds == 60.0
    assert timeouts.timeout("save").source == "learned"


def test_learned_samples_are_saved_and_a_new_agent_starts_from_them(tmp_path, caplog):
    path = tmp_path / "heartbeats.json"
    first = LearnedTimeouts(HeartbeatSettings(), path)
    first.mark_instrumented()
    for _ in range(20):
        first.observe(STEP, 1.5)
    first.save()
    caplog.set_level("INFO")
    second = LearnedTimeouts(HeartbeatSettings(), path)
    second.load()
    assert second.instrumented
    assert second.timeout(STEP).seconds == 3.0
    assert "learned by an earlier agent" in caplog.text


def test_a_corrupt_heartbeat_file_is_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "heartbeats.json"
    path.write_text('{"samples": [1, 2')
    timeouts = LearnedTimeouts(HeartbeatSettings(), path)
    timeouts.load()
    assert timeouts.timeout(STEP).source == "initial"
    assert "Ignoring" in caplog.text and "not a heartbeat record" in caplog.text


# -- the monitor ---------------------------------------------------------------------------


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

    monitor = ProgressMonitor(timeouts, StepTimes(2, 5, lambda s: None), hangs.append,
                              lambda lr: True, drain=drain)  # fmt: skip
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


# -- stacks and the verdict ----------------------------------------------------------------

FAULTHANDLER = """\
Thread 0x00007f2 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f1 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 2806 in all_reduce
  File "/v/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/job/train.py", line 20 in step
  File "/job/train.py", line 30 in <module>
"""

PY_SPY = """\
Process 4242: python -u train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4243 (idle): "Thread-1"
    wait (threading.py:320)
Thread 4242 (idle): "MainThread"
    step (/job/train.py:17)
    <module> (/job/train.py:30)
"""


def test_dumps_are_read_for_the_main_thread_and_whether_it_waits_in_a_collective():
    frames, threads = parse_faulthandler(FAULTHANDLER)
    dump = StackDump(0, Path("/x"), "faulthandler", frames, threads)
    assert threads == 2
    assert dump.waiting_in == "all_reduce"
    assert dump.where == "step (/job/train.py:20)"
    frames, threads = parse_py_spy(PY_SPY)
    dump = StackDump(1, Path("/y"), "py-spy", frames, threads)
    assert (threads, dump.waiting_in, dump.where) == (2, None, "step (/job/train.py:17)")


def test_the_verdict_names_the_rank_outside_the_collective_even_if_it_beat_last():
    timeout = Timeout(2.0, "learned", 30, 1.0)
    silences = [  # rank 1 sent its last heartbeat a little after the others
        Silence(0, 100, STEP, 1.0, 2.30, timeout, True, 9, 39),
        Silence(1, 101, STEP, 1.1, 2.20, timeout, True, 9, 39),
        Silence(2, 102, STEP, 1.0, 2.30, timeout, True, 9, 39),
    ]
    waiting, _ = parse_faulthandler(FAULTHANDLER)
    sleeping, _ = parse_py_spy(PY_SPY)
    dumps = {
        0: StackDump(0, Path("/l/0/stacks.txt"), "faulthandler", waiting, 2),
        1: StackDump(1, Path("/l/1/stacks.txt"), "faulthandler", sleeping, 2),
        2: StackDump(2, Path("/l/2/stacks.txt"), "faulthandler", waiting, 2),
    }
    verdict = judge(silences, dumps, {0: 4, 1: 5, 2: 6}, "/l/*/stacks.txt")
    assert verdict.culprit.local_rank == 1
    assert verdict.why.startswith("hang: rank 5 stopped first (no progress for 2.20s in the step")
    assert "it was at step (/job/train.py:17)" in verdict.why
    assert "ranks 4, 6 waiting in all_reduce" in verdict.why
    assert verdict.details["rank"] == 5 and verdict.details["section"] is None
    assert [r["stack"]["waiting_in"] for r in verdict.details["ranks"]] == [
        "all_reduce",
        None,
        "all_reduce",
    ]


def test_without_telling_dumps_the_rank_silent_longest_is_named():
    timeout = Timeout(600.0, "initial")
    silences = [
        Silence(0, 100, STEP, 5.0, 3.0, timeout, False, 4, 39),
        Silence(1, 101, STEP, None, 601.0, timeout, True, 0, 0),
    ]
    verdict = judge(silences, {}, {0: 0, 1: 1}, "stacks")
    assert verdict.culprit.local_rank == 1
    assert "sent no heartbeat since it started" in verdict.why


def test_when_every_local_rank_waits_the_report_points_to_another_node():
    timeout = Timeout(2.0, "learned", 30, 1.0)
    silences = [Silence(0, 100, STEP, 1.0, 2.2, timeout, True, 9, 39)]
    waiting, _ = parse_faulthandler(FAULTHANDLER)
    dumps = {0: StackDump(0, Path("/l/0/stacks.txt"), "faulthandler", waiting, 2)}
    verdict = judge(silences, dumps, {0: 0}, "/l/*/stacks.txt")
    assert "every local rank waits in a collective" in verdict.why
    assert verdict.details["waiting_on_another_node"] is True
