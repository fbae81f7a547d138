from __future__ import annotations

import pytest

from agentd.exceptions import ConfigError
from agentd.restart_policy import RestartBackoff, RestartPolicy


def test_no_backoff_by_default():
    assert RestartBackoff().delay(5) == 0.0


def test_exponential_with_cap_and_jitter():
    backoff = RestartBackoff(initial=1.0, maximum=10.0, factor=2.0, jitter=0.1)
    middle = lambda: 0.5  # noqa: E731  (no jitter at the midpoint)
    assert [backoff.delay(n, middle) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff.delay(2, lambda: 1.0) == pytest.approx(2.2)
    assert backoff.delay(2, lambda: 0.0) == pytest.approx(1.8)
    assert backoff.delay(9, lambda: 1.0) == 10.0  # jitter never exceeds the cap


def test_parse():
    assert RestartBackoff.parse("0.5") == RestartBackoff(0.5, 60.0, 2.0, 0.1)
    assert RestartBackoff.parse("1:30:3:0") == RestartBackoff(1.0, 30.0, 3.0, 0.0)
    for bad, rule in [
        ("x", "must be numbers"),
        ("1:0.5", "max must be >="),
        ("1:2:0.5", "factor must be >= 1"),
        ("1:2:2:2", "jitter"),
        ("1:2:3:4:5", "INITIAL"),
    ]:
        with pytest.raises(ConfigError, match=rule):
            RestartBackoff.parse(bad)


def test_policy():
    policy = RestartPolicy(max_restarts=2, non_retryable_exit_codes=frozenset({3}))
    assert policy.is_retryable(1) and policy.is_retryable(-9)
    assert not policy.is_retryable(3)
    with pytest.raises(ConfigError):
        RestartPolicy(max_restarts=-1)
