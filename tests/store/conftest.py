"""Fixtures of the store's tests."""

from __future__ import annotations

import pytest

from tests.store.test_failover import Candidates


@pytest.fixture
async def three():
    """Three candidate servers on 127.0.0.1-3, all started (see :class:`Candidates`)."""
    group = Candidates(3)
    for index in range(3):
        await group.start(index)
    yield group
    await group.close()
