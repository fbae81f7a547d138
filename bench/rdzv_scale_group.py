"""A group of agentd rendezvous handlers in one process, for the scale benchmark.

``rdzv_scale_group.py store|etcd TARGET RUN_ID NNODES COUNT SOURCE``: opens COUNT handlers
of an NNODES-node rendezvous, each with its own client of the ``agentd store`` at TARGET
(host:port) or the etcd cluster at TARGET (its members' URLs, comma-separated; keys under
``/bench/RUN_ID/``), with the agents' default settings (a heartbeat every 5 s). The
handlers' address (where they reserve a port for the workers' store) and their store
connections' source address is SOURCE, a loopback address of this process's own: one
address has about 28,000 ephemeral ports, and 16,384 handlers on one machine reserve
16,384 ports and hold about 33,000 store connections. Before the
clock starts, each handler opens its store client and asks the store's revision once (an
agent does that as it starts), and the process's objects are frozen out of the garbage
collector (``gc.freeze()``: one process holds COUNT handlers' objects, where an agent
holds one handler's, so its collections would cost COUNT times what an agent's do). These
are handlers, not agents: no agent processes, no workers. It prints ``ready``, waits for a
line on stdin (go), joins them all at once and prints one JSON line: the epoch time the
last handler had its result, the store requests they made, this process's CPU seconds
and peak RSS. On ``steady SECONDS`` (optional), every handler writes for SECONDS what its
agent writes while its workers run (:func:`running`) and the process prints the requests
made. Then, on ``watch``, every handler watches its round (``{"watching": true}``);
on ``crash`` handler 0 ends the round as its agent does when a worker crashes (on any
other line nobody does), and once every handler was told, all join the next round: one
JSON line with when the crash was, when the last handler was told and when the last had
its next round (the handlers later than :data:`LATE` are named on stderr). It leaves when
stdin closes. With ``SCALE_LOG=PATH`` every handler's log lines from INFO up go to
``PATH.SOURCE``, for a diagnosis; ``SCALE_KEEPALIVE=SECONDS`` sets how long the store's
clients keep an idle connection (0: none, so a handler holds one connection, its long
poll's, and not a second one for its heartbeats).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import random
import resource
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

LATE = 5.0
"""Seconds past the last handler told after which a handler's next round is named late."""

if TYPE_CHECKING:
    from agentd.rendezvous.api import RendezvousInfo
    from agentd.store.api import Store


def connect_from(source: str) -> None:
    """The embedded store's clients in this process connect from ``source``."""
    from agentd.store import http_client

    make = http_client.keepalive_socket

    def bound(addr_info: tuple[Any, ...]) -> socket.socket:
        sock = make(addr_info)
        sock.bind((source, 0))
        return sock

    http_client.keepalive_socket = bound


def client(kind: str, target: str, run_id: str) -> Store:
    if kind == "etcd":
        from agentd.store.etcd.store import EtcdStore

        return EtcdStore(target.split(","), prefix=f"/bench/{run_id}/")
    from agentd.store.http_client import HttpStore

    return HttpStore(target)


RECORD = {
    "node": "vm-0123-abcdef",
    "host": "node-0123.cluster.example",
    "state": "HEALTHY",
    "ranks": list(range(8)),
    "attempt": 0,
    "restarts": 0,
    "max_restarts": 3,
    "steps": 12345,
    "step_rate": 2.031,
    "step_time": 0.492311,
    "compute": 0.401234,
    "last_failure": None,
    "drain": None,
    "gpu_memory_mib": 61234,
}
"""A job-view record as an agent of 8 workers publishes it (agentd/jobview/record.py)."""


async def running(handler: Any, info: Any, seconds: float) -> None:
    """``seconds`` of what ``handler``'s agent writes to the store while its workers run,
    besides the heartbeats (which go on): its job-view record every heartbeat interval
    (agentd/jobview/publisher.py), and its straggler comparison's ticks, paced as
    agentd/slownodes/service.py paces them (a random phase, so the job's rate is its
    rate): on odd ticks, group rank 0 gathers every member's times and judges them, and
    the others publish theirs; on even ticks, rank 0 publishes its verdict and the others
    read it."""
    from agentd.slownodes.judge import NodeJudge
    from agentd.slownodes.settings import SlowNodeSettings

    settings = SlowNodeSettings()
    size, rank, generation = info.group_world_size, info.group_rank, info.generation
    paced = settings.paced(size)
    interval = 5.0  # the heartbeat interval, the publisher's too
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    next_record = loop.time() + random.uniform(0, interval)
    next_tick, ticks = loop.time() + random.uniform(0, paced), 0
    judge = NodeJudge(settings.factor, settings.window(size))
    own = {"node": handler.node_id, "sections": {"forward": 0.2, "backward": 0.3}}
    while True:
        wake = min(next_record, next_tick)
        if wake >= end:
            return
        await asyncio.sleep(max(0.0, wake - loop.time()))
        if next_record <= next_tick:
            doc = {**RECORD, "node": handler.node_id, "at": time.time()}
            await handler.job.publish(generation, rank, doc, ttl=3 * interval)
            next_record += interval
            continue
        ticks += 1
        next_tick += paced
        if rank == 0 and ticks % 2:
            docs = {**await handler.timings.gather(generation, size), 0: own}
            judge.judge({d["node"]: d["sections"] for d in docs.values()}, time.monotonic())
        elif rank == 0:
            await handler.timings.decide(generation, {"slow": [], "at": time.time()})
        elif ticks % 2:
            await handler.timings.publish(generation, rank, {**own, "at": time.time()}, 4 * paced)
        else:
            await handler.timings.verdict(generation)


def report(doc: dict[str, Any]) -> None:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({**doc, "rss_mb": rss}), flush=True)


async def main(kind: str, target: str, run_id: str, nnodes: int, count: int, source: str) -> None:
    from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
    from agentd.store.connect import OpenedStore

    if kind == "store":
        connect_from(source)
        if os.environ.get("SCALE_KEEPALIVE"):  # not the agents' default: bench_rdzv says
            import agentd.store.http_client as http_client

            http_client.KEEPALIVE = float(os.environ["SCALE_KEEPALIVE"])
    clients = [client(kind, target, run_id) for _ in range(count)]

    def opener(client: Store):
        async def open_store() -> OpenedStore:
            return OpenedStore(client, client.close)

        return open_store

    # the agents' defaults, keep-alive included: each handler renews its heartbeat every
    # 5 s, as an agent does, measured along with the rendezvous
    settings = RendezvousSettings(min_nodes=nnodes, max_nodes=nnodes)
    handlers = [DynamicRendezvous(run_id, opener(c), settings, addr=source) for c in clients]
    loop = asyncio.get_running_loop()
    try:
        for handler in handlers:
            await handler._open()
            await handler.store.revision()
        before = sum(c.requests for c in clients)  # type: ignore[attr-defined]
        gc.freeze()  # one process holds COUNT agents' objects: an agent holds one's
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        cpu = time.process_time()

        infos: dict[int, RendezvousInfo] = {}

        async def join(handler: DynamicRendezvous) -> float:
            infos[id(handler)] = await handler.next_rendezvous()
            return time.time()

        async def told(handler: DynamicRendezvous) -> float:
            await handler.round_over()
            return time.time()

        done = await asyncio.gather(*(join(h) for h in handlers))
        report(
            {
                "done": max(done),
                "cpu": time.process_time() - cpu,
                "requests": sum(c.requests for c in clients) - before,
            }
        )  # type: ignore[attr-defined]
        command = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if command[:1] == ["steady"]:  # the job runs: what every agent writes meanwhile
            before = sum(c.requests for c in clients)  # type: ignore[attr-defined]
            seconds = float(command[1])
            await asyncio.gather(*(running(h, infos[id(h)], seconds) for h in handlers))
            requests = sum(c.requests for c in clients) - before  # type: ignore[attr-defined]
            report({"requests": requests})
            command = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if command != ["watch"]:
            return
        watches = [asyncio.create_task(told(h)) for h in handlers]
        report({"watching": True})
        crashed_at = None
        if (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "crash":
            crashed_at = time.time()  # a worker of handler 0's node crashed: its agent
            await handlers[0].end_round("a worker crashed")  # ends the round for everyone
        told_at = await asyncio.gather(*watches)
        done = await asyncio.gather(*(join(h) for h in handlers))
        late = sorted(
            (round(at - max(told_at), 1), h.node_id)
            for at, h in zip(done, handlers, strict=True)
            if at - max(told_at) > LATE
        )
        if late:  # what to look for in SCALE_LOG's files
            print(
                f"{len(late)} handler(s) had the next round more than {LATE:g} s after the "
                f"last was told (seconds, node): {late[-10:]}",
                file=sys.stderr,
                flush=True,
            )
        report({"crashed_at": crashed_at, "told": max(told_at), "done": max(done)})
        await loop.run_in_executor(None, sys.stdin.read)
    finally:  # the store may stop first: its heartbeats failing now is no news
        logging.getLogger("agentd").setLevel(logging.ERROR)
        await asyncio.gather(*(handler.shutdown() for handler in handlers))


if __name__ == "__main__":
    if os.environ.get("SCALE_LOG"):  # a diagnosis: every handler's INFO lines to a file
        logging.basicConfig(
            filename=f"{os.environ['SCALE_LOG']}.{sys.argv[6]}",
            level=logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    kind, target, run_id, nnodes, count, source = sys.argv[1:7]
    asyncio.run(main(kind, target, run_id, int(nnodes), int(count), source))
