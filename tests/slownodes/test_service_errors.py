"""The comparison never dies silently: a store error skips a tick with a WARNING (once a
minute), a bug stops it with an ERROR and its traceback."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from agentd.slownodes.service import SlowNodeService
from agentd.slownodes.settings import SlowNodeSettings
from agentd.store.api import StoreError


class Timings:
    """A store's timings that fail as told, counting the requests."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def gather(self, generation: int, size: int) -> dict:
        self.calls += 1
        raise self.error


def service(timings: Timings) -> SlowNodeService:
    group = SimpleNamespace(group_world_size=2, group_rank=0)
    view = SimpleNamespace(generation=0, get_worker_group=lambda: group)

    async def waiting() -> int:
        return 0

    return SlowNodeService(
        SlowNodeSettings(interval=0.01),
        timings,  # type: ignore[arg-type]
        "node-a",
        view,  # type: ignore[arg-type]
        lambda: {"compute": 1.0},
        waiting,
        lambda *args: None,
    )


async def until(predicate) -> None:
    async with asyncio.timeout(20):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_a_store_error_skips_a_tick_with_a_warning_and_goes_on(caplog):
    timings = Timings(StoreError("store: 503 overloaded"))
    slow = service(timings)
    slow.workers_started()
    try:
        await until(lambda: timings.calls >= 2)  # it went on after the first error
    finally:
        await slow.workers_stopping()
    warned = [r for r in caplog.records if "skipped a tick" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING  # once a minute
    assert "503 overloaded" in warned[0].getMessage()


async def test_a_bug_stops_the_comparison_with_an_error_and_its_traceback(caplog):
    timings = Timings(KeyError("sections"))
    slow = service(timings)
    slow.workers_started()
    task = slow._task
    assert task is not None
    await asyncio.wait_for(asyncio.shield(task), 20)  # it ended by itself
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "straggler comparison stopped" in error.getMessage() and error.exc_info
    assert timings.calls == 1
    await slow.workers_stopping()
