"""run_shielded: cleanup that survives the cancellation of its caller."""

from __future__ import annotations

import asyncio

import pytest

from agentd.support.aio import run_shielded


async def test_a_cancelled_caller_still_runs_the_cleanup_to_its_end():
    release = asyncio.Event()
    done: list[str] = []

    async def cleanup() -> str:
        await release.wait()
        done.append("cleaned")
        return "ok"

    caller = asyncio.create_task(run_shielded(cleanup()))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)
    caller.cancel()  # twice: still shielded
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert done == ["cleaned"]


async def test_without_cancellation_the_result_comes_back():
    async def cleanup() -> int:
        await asyncio.sleep(0)
        return 7

    assert await run_shielded(cleanup()) == 7
