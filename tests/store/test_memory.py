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


async def test_watches_read_the_history_as_a_full_scan_would_through_eviction_and_trims():
    """The per-prefix index (bisection instead of a scan) keeps up with every change,
    drops prefixes past its limit and trims what the history let go; every answer still
    equals a scan of the history."""
    from agentd.store import watch_index

    store = MemoryStore(history=300, stall_guard=False)
    cold = [f"cold/{i}/" for i in range(watch_index.PREFIXES + 10)]
    hot = [f"hot/{i}/" for i in range(4)]

    def check(prefix: str, back: int) -> None:
        history = store._history
        after = history[0].revision - 1 + back  # from the oldest event the history holds on
        got = store.changes_since(prefix, after)
        assert not got.compacted
        assert got.events == tuple(
            e for e in history if e.revision > after and e.key.startswith(prefix)
        )

    for i in range(3 * watch_index.TRIM_EVERY):
        prefix = hot[i % len(hot)] if i % 2 else cold[i * 7 % len(cold)]
        await store.set(f"{prefix}k{i % 3}", str(i).encode())
        if i % 97 == 0:
            await store.delete(f"{prefix}k{(i + 1) % 3}")
        for back in (0, i % 40):  # indexed, then kept up to date change by change
            check(hot[i % len(hot)], back)
        if i % 50 == 0:
            check(cold[i % len(cold)], i % 40)  # more prefixes than the index keeps
    assert store.changes_since("hot/", 0).compacted  # older than the history: re-read


async def test_a_snapshot_restored_elsewhere_holds_the_keys_with_the_seconds_they_had_left():
    now = [100.0]
    old = MemoryStore(clock=lambda: now[0], stall_guard=False)
    await old.set("ctl/gen", b"3")
    await old.set("ctl/hb/a", b"1", ttl=15.0)
    await old.set("gone", b"x", ttl=1.0)
    await old.set("ctl/gen", b"4")  # rewritten: it comes last, as written last
    now[0] += 2.0  # "gone" has expired, the heartbeat has 13 s left
    items = old.snapshot()
    assert items == [("ctl/hb/a", b"1", 13.0), ("ctl/gen", b"4", None)]
    later = [0.0]
    new = MemoryStore(clock=lambda: later[0], stall_guard=False)
    new.restore(items)
    assert await new.multi_get(["ctl/gen", "ctl/hb/a", "gone"]) == [b"4", b"1", None]
    later[0] = 12.9
    assert await new.get("ctl/hb/a") == b"1"
    later[0] = 13.0  # its lease ends when it would have ended in the old store
    assert await new.get("ctl/hb/a") is None
    await old.close()
    await new.close()
