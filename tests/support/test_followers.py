"""The agent's end waits for the followers of an endpoint (``agentd logs --follow``,
``agentd status --job --watch``) to be told that its run ended, and for no one else."""

from __future__ import annotations

import asyncio

import pytest

from agentd.support import followers
from agentd.support.followers import FOLLOW_HEADER, Followers, follow_interval


@pytest.mark.parametrize(
    ("value", "every"),
    [
        ("1", 1.0),
        ("0.2", 0.2),
        ("30", 30.0),
        ("0", None),
        ("-1", None),
        ("nan", None),
        ("inf", None),
        ("yes", None),
        ("", None),
    ],
)
def test_a_followers_interval_is_read_from_its_header(value, every):
    assert follow_interval({FOLLOW_HEADER: value}) == every
    assert follow_interval({}) is None


async def test_the_end_waits_for_a_follower_to_be_told_and_not_for_one_gone(monkeypatch):
    nobody = Followers()
    await asyncio.wait_for(nobody.end(), 1)  # nobody follows: no wait
    assert nobody.asked(None) is True

    followed = Followers()
    assert followed.asked(1.0) is False
    end = asyncio.ensure_future(followed.end())
    await asyncio.sleep(0)
    assert followed.ended and not end.done()
    assert followed.asked(1.0) is True  # read after the end: every line is there
    await asyncio.sleep(0)
    assert not end.done()
    followed.told()
    await asyncio.wait_for(end, 1)

    monkeypatch.setattr(followers, "MARGIN", 0.1)
    gone = Followers()  # a follower that asked once, then was interrupted
    gone.asked(0.1)
    await asyncio.wait_for(gone.end(), 5)

    rare = Followers()  # one asking less often than LONGEST is not waited for
    rare.asked(followers.LONGEST + 1)
    await asyncio.wait_for(rare.end(), 0.05)
