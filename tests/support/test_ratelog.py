"""RateLimitedLog: a kind of problem is logged once per interval, with the count held back."""

from __future__ import annotations

import logging

from agentd.support.ratelog import RateLimitedLog


def test_one_line_per_interval_and_kind_with_the_count_held_back(caplog):
    now = [0.0]
    problems = RateLimitedLog(logging.getLogger("t"), interval=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            problems.warning("slow", "slow client %s", "x")
        problems.warning("full", "disk full")
        now[0] = 10.5
        problems.warning("slow", "slow client %s", "y")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "slow client x",
        "disk full",
        "slow client y (999 more like it in the last 10s)",
    ]
    assert problems.counts == {"slow": 1001, "full": 1}


SERVER = """
import asyncio, logging, resource, sys
from agentd.support.ratelog import rate_limited_loop_errors

resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
logging.basicConfig(level=logging.INFO, stream=sys.stderr)

async def main():
    asyncio.get_running_loop().set_exception_handler(rate_limited_loop_errors())
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.sleep(4)  # the flood comes, accept() runs out, asyncio retries each second

asyncio.run(main())
"""


def test_accept_out_of_descriptors_is_one_warning_and_no_traceback(tmp_path):
    """A real EMFILE in asyncio's accept(): a server whose soft limit is 48 descriptors,
    sent 100 connections that it holds open. asyncio reports it once a second; before, the
    first report carried a traceback."""
    import socket
    import subprocess
    import sys

    err = tmp_path / "server.err"
    with open(err, "wb") as fp:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, stderr=fp, text=True
        )
    socks = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(100):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            socks.append(sock)
        assert proc.wait(30) == 0
    finally:
        for sock in socks:
            sock.close()
        proc.kill()
        proc.wait()
        proc.stdout.close()
    text = err.read_text()
    assert "Traceback" not in text, text
    warnings = [line for line in text.splitlines() if "ran out of descriptors" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING:asyncio:"), text
