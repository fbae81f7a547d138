"""Stack dumps read (faulthandler, py-spy) and the verdict on who hung first."""

from __future__ import annotations

from pathlib import Path

from agentd.heartbeats.monitor import Silence
from agentd.heartbeats.settings import STEP
from agentd.heartbeats.stacks import StackDump, parse_faulthandler, parse_py_spy
from agentd.heartbeats.timeouts import Timeout
from agentd.heartbeats.verdict import judge

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
