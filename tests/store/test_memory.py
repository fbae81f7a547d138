"""The in-memory store's waiters: a write wakes only those waiting on its key's prefix."""

from __future__ import annotations

import asyncio

from agentd.store.memory import MemoryStore


async def test_writes_elsewhere_do_not_wake_a_watcher(monkeypatch):
    store = MemoryStore(stall_guard=False)
    looks = 0
    read = store.changes_since

    def counted(prefix: str, after: int):
        nonlocal looks
        looks += 1
        return read(prefix, after)

    monkeypatch.setattr(store, "changes_since", counted)
    start = await store.revision()
    watch = asyncio.ensure_future(store.watch("round/3/sealed", start, 30))
    await asyncio.sleep(0)
    for node in range(200):  # a round's joins: other keys
        await store.set(f"round/3/node/{node}", b"{}")
    await asyncio.sleep(0)
    assert looks == 1 and not watch.done()  # never woken by them
    await store.set("round/3/sealed", b"200")
    result = await asyncio.wait_for(watch, 5)
    assert [e.key for e in result.events] == ["round/3/sealed"] and looks == 2
    await store.close()


async def test_every_watcher_of_a_key_wakes_and_reads_only_what_is_new():
    store = MemoryStore(stall_guard=False)
    for node in range(50):
        await store.set(f"round/0/node/{node}", b"{}")
    start = await store.revision()
    watches = [asyncio.ensure_future(store.watch("round/0/sealed", start, 30)) for _ in range(64)]
    await asyncio.sleep(0)
    await store.set("round/0/sealed", b"50")
    results = await asyncio.wait_for(asyncio.gather(*watches), 5)
    assert all([e.value for e in r.events] == [b"50"] for r in results)
    await store.close()


async def test_waiters_that_time_out_leave_nothing_behind():
    store = MemoryStore(stall_guard=False)
    start = await store.revision()
    await asyncio.gather(*(store.watch(f"ctl/{i}/", start, 0.01) for i in range(300)))
    waits = [store.wait([f"missing/{i}"], 0.01) for i in range(300)]
    outcomes = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(o, TimeoutError) for o in outcomes)
    assert store.waiting == 0  # no registration outlives its waiter
    await store.close()
