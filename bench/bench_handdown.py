"""How large is the embedded store's state, and how long does handing it down hold requests?

    python bench/bench_handdown.py [--nodes 1024,8192] [--seconds 12] [--record]

For each job size N, N rendezvous handlers (the agents' code, default settings) in this
process meet in one in-memory store, then write for ``--seconds`` what their agents write
while the workers run (heartbeats, job-view records, the straggler comparison's ticks:
``rdzv_scale_group.running``). The store's state then (every live key, its value and TTL,
as ``inherit`` sends it) gives the bytes per node. That state is then restored into a
real candidate server on 127.0.0.1 serving under term 1, which hands it down to a second
one standing by on 127.0.0.2 (agentd/store/succession.py, as a store's host in its exit
barrier does): ``hold`` is how long the host held requests meanwhile, from its log line,
the median of three hand-downs.

Before 2026-12-02 (late), ``inherit`` was held to any request's 4 MiB body, so a state of
more than about 5,000 nodes was never handed down; it may now carry 128 MiB
(``agentd.store.wire.INHERIT_MAX_BODY``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import secrets
import statistics
import sys
import time

from rdzv_scale_group import running
from run_control import free_port

HANDED = re.compile(r"holding requests for ([\d.]+) ms")


async def state_of(nodes: int, seconds: float) -> list[tuple[str, bytes, float | None]]:
    """The store's state after ``nodes`` handlers met and wrote for ``seconds``."""
    from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
    from agentd.store.connect import OpenedStore
    from agentd.store.memory import MemoryStore

    store = MemoryStore()

    async def kept_open() -> None:
        return None

    async def opener() -> OpenedStore:
        return OpenedStore(store, kept_open)

    settings = RendezvousSettings(min_nodes=nodes, max_nodes=nodes)
    handlers = [
        DynamicRendezvous("bench", opener, settings, addr="127.0.0.1") for _ in range(nodes)
    ]
    try:
        infos = await asyncio.gather(*(h.next_rendezvous() for h in handlers))
        await asyncio.gather(
            *(running(h, i, seconds) for h, i in zip(handlers, infos, strict=True))
        )
        return store.snapshot()
    finally:
        logging.getLogger("agentd").setLevel(logging.ERROR)
        await asyncio.gather(*(h.shutdown() for h in handlers))
        logging.getLogger("agentd").setLevel(logging.WARNING)


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def hold_ms(items: list[tuple[str, bytes, float | None]]) -> float:
    """The ms a serving candidate held requests while it handed ``items`` down."""
    from agentd.store.candidacy import Candidacy
    from agentd.store.failover import FailoverStore
    from agentd.store.server import StoreServer
    from agentd.store.succession import hand_down

    token, port = secrets.token_hex(16), free_port()
    endpoints = [f"127.0.0.{i + 1}:{port}" for i in range(2)]
    servers = [
        StoreServer(f"127.0.0.{i + 1}", port, token, candidacy=Candidacy(endpoints, i, token))
        for i in range(2)
    ]
    client = FailoverStore(endpoints, token, retry_timeout=5.0, request_timeout=5.0)
    said, succession = Said(), logging.getLogger("agentd.store.succession")
    succession.addHandler(said)
    succession.setLevel(logging.INFO)
    try:
        for server in servers:
            await server.start()
        await client.set("promote", b"1")  # candidate 0 serves, under term 1
        servers[0].store.restore(items)
        if await hand_down(servers[0], [endpoints[1]]) != endpoints[1]:
            sys.exit(f"the state was not handed down: {said.lines}")
        restored = servers[1].store.snapshot()
        if len(restored) != len(items) + 1:
            sys.exit(f"the successor holds {len(restored)} keys, not {len(items) + 1}")
        found = [float(m.group(1)) for m in map(HANDED.search, said.lines) if m]
        return found[-1]
    finally:
        succession.removeHandler(said)
        await client.close()
        for server in servers:
            await server.stop()


async def measure(nodes: int, seconds: float) -> tuple[int, float, float]:
    """(keys, bytes per node as sent, median hold in ms) for a job of ``nodes``."""
    from agentd.store.ops import encode_items

    items = await state_of(nodes, seconds)
    sent = len(json.dumps({"items": encode_items(items)}))
    holds = [await hold_ms(items) for _ in range(3)]
    return len(items), sent / nodes, statistics.median(holds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", default="1024,8192", help="job sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=12.0, help="the job's running time")
    parser.add_argument("--record", action="store_true", help="write the figures")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    print(f"the store's state, and its hand-down's hold, by job size ({os.cpu_count()} CPUs)")
    results = {}
    for nodes in sizes:
        began = time.monotonic()
        keys, per_node, hold = asyncio.run(measure(nodes, args.seconds))
        results[nodes] = (per_node, hold)
        print(
            f"  {nodes:>6} nodes: {keys} keys, {per_node:.0f} bytes a node as sent "
            f"({per_node * nodes / 2**20:.2f} MiB); hold {hold:.1f} ms (median of 3) "
            f"[{time.monotonic() - began:.0f} s]",
            flush=True,
        )
    if args.record:
        from figures import record

        command = f".venv/bin/python bench/bench_handdown.py --nodes {args.nodes} --record"
        largest = max(sizes)
        per_node, hold = results[largest]
        record("handdown_state_per_node", f"{per_node / 1024:.2f} KiB", command)
        record("handdown_hold_largest", f"{hold:.0f} ms", command)
        record("handdown_largest_nodes", f"{largest:,}", command)


if __name__ == "__main__":
    main()
