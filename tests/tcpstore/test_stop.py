"""The workers' store stops with clients still connected (an in-process restart's
survivors hold connections to the last attempt's store): quietly, every connection closed."""

from __future__ import annotations

import asyncio
import logging

from agentd.tcpstore.server import TCPStoreServer


async def test_a_stop_with_idle_clients_connected_logs_no_error(caplog):
    server = TCPStoreServer("127.0.0.1", 0)
    await server.start()
    clients = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
    async with asyncio.timeout(10):  # each one's session waits for its first byte
        while len(server._connections) < 3:
            await asyncio.sleep(0.01)
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        await server.stop()
        await asyncio.sleep(0.05)  # the loop's callbacks for the cancelled tasks run now
    for reader, writer in clients:
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the store
        writer.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
