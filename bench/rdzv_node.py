"""One node of a rendezvous benchmark: join through agentd's or torch's handler, time it.

``rdzv_node.py agentd|torch ENDPOINT RUN_ID NNODES HOST(0|1) OUT GO``: builds the handler,
writes ``OUT.ready``, waits until the file GO exists (GO empty: at once), then records
the epoch times at which it started to join and at which the round completed in OUT.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from report_files import write_report


def wait_for_go(go: str) -> None:
    while go and not os.path.exists(go):
        time.sleep(0.0005)


def torch_node(endpoint: str, run_id: str, nnodes: int, host: bool, out: str, go: str) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    params = RendezvousParameters("c10d", endpoint, run_id, nnodes, nnodes, is_host=host)
    handler = get_rendezvous_handler(params)
    write_report(out + ".ready", "")
    wait_for_go(go)
    joined = time.time()
    handler.next_rendezvous()
    done = time.time()
    write_report(out, json.dumps({"joined": joined, "done": done}))
    time.sleep(2)  # keep the TCPStore up while the others read their result


async def agentd_node(
    endpoint: str, run_id: str, nnodes: int, host: bool, out: str, go: str
) -> None:
    from agentd.rendezvous.dynamic import DynamicRendezvous, RendezvousSettings
    from agentd.store.connect import http_store_opener
    from agentd.support.net import split_endpoint

    address, port = split_endpoint(endpoint)
    handler = DynamicRendezvous(
        run_id,
        http_store_opener(address, port, None, host),
        RendezvousSettings(min_nodes=nnodes, max_nodes=nnodes),
    )
    await handler._open()  # connect (or serve) before the clock starts, as torch's does
    write_report(out + ".ready", "")
    await asyncio.to_thread(wait_for_go, go)
    joined = time.time()
    await handler.next_rendezvous()
    done = time.time()
    write_report(out, json.dumps({"joined": joined, "done": done}))
    await asyncio.sleep(2)  # keep a hosted store up while the others read their result
    await handler.shutdown()


def main() -> None:
    backend, endpoint, run_id, nnodes, host, out, go = sys.argv[1:8]
    if backend == "torch":
        torch_node(endpoint, run_id, int(nnodes), host == "1", out, go)
    else:
        asyncio.run(agentd_node(endpoint, run_id, int(nnodes), host == "1", out, go))


if __name__ == "__main__":
    main()
