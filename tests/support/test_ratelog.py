"""RateLimitedLog: a kind of problem is logged once per interval, with the count held back."""

from __future__ import annotations

import logging

from agentd.support.ratelog import RateLimitedLog


def test_one_line_per_interval_and_kind_with_the_count_held_back(caplog):
    now = [0.0]
    problems = RateLimitedLog(logging.getLogger("t"), interval=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            problems.warning("slow", "slow client %s", "x")
        problems.warning("full", "disk full")
        now[0] = 10.5
        problems.warning("slow", "slow client %s", "y")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["slow client x", "disk full",
                     "slow client y (999 more like it in the last 10s)"]  # fmt: skip
    assert problems.counts == {"slow": 1001, "full": 1}
