"""Timeouts from flags, or learned from the intervals seen, saved for the next agent."""

from __future__ import annotations

import pytest

from agentd.heartbeats.settings import START, STEP, HeartbeatSettings
from agentd.heartbeats.timeouts import MIN_SAMPLES, RESUME_FLOOR, LearnedTimeouts, Timeout
from agentd.wire.progress import check_section_name


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


def test_a_resumed_rank_is_held_to_the_starts_seen_plus_the_preload_never_under_the_floor():
    timeouts = LearnedTimeouts(HeartbeatSettings(initial_timeout=600.0))
    assert timeouts.timeout(START) == Timeout(600.0, "initial")  # no start seen yet
    timeouts.observe(START, 4.0)  # one new worker's start is enough: the floor guards it
    assert timeouts.timeout(START) == Timeout(RESUME_FLOOR, "learned", 1, 4.0, sampled="starts")
    timeouts.observe(START, 20.0)
    assert timeouts.timeout(START).seconds == 40.0  # the slowest start, times the factor
    timeouts.allowance = 5.0  # this node's zygote took 5 s to preload
    assert timeouts.timeout(START) == Timeout(50.0, "learned", 2, 20.0, 5.0, "starts")
    assert timeouts.timeout(START).describe() == (
        "50.00s learned (p99 of 2 starts 20.000s + 5.00s preload)"
    )
    timeouts.observe(START, 400.0)
    assert timeouts.timeout(START).seconds == 600.0  # never above the initial timeout


def test_the_resume_flag_overrides_what_is_learned_and_starts_are_saved(tmp_path):
    path = tmp_path / "heartbeats.json"
    first = LearnedTimeouts(HeartbeatSettings(), path)
    first.observe(START, 3.0)
    first.save()
    second = LearnedTimeouts(HeartbeatSettings(), path)
    second.load()
    assert second.timeout(START) == Timeout(RESUME_FLOOR, "learned", 1, 3.0, sampled="starts")
    flagged = LearnedTimeouts(HeartbeatSettings(resume_timeout=5.0), path)
    flagged.load()
    assert flagged.timeout(START) == Timeout(5.0, "explicit", 1)
    assert flagged.status()["resume"] == {"seconds": 5.0, "source": "explicit", "samples": 1}


def test_no_section_can_take_the_resumes_key():
    with pytest.raises(ValueError, match="without NUL"):
        check_section_name(START)
