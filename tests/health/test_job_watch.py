"""``agentd status --job --watch`` against an endpoint whose answers the test scripts: a
store that does not answer for a while is said under the last view and the watch goes
on; the run's end stops it with a pointer to another node's agent where the job may go
on without this one. (``tests/integration/test_health_cli.py`` watches real agents.)"""

from __future__ import annotations

import asyncio

from agentd.health import job_cli
from agentd.health.server import HealthCheckServer
from agentd.jobview.document import job_document
from agentd.store.api import StoreUnavailable


def view(ended: str | None, state: str) -> dict:
    header = {
        "run_id": "job",
        "generation": 3,
        "world_size": 2,
        "size": 2,
        "answered_by": 0,
        "ended": ended,
        "min_nodes": 1,
        "max_nodes": 2,
        "spares": 0,
        "store": None,
    }
    records = {
        rank: {
            "node": f"n{rank}",
            "host": f"127.0.0.{rank + 1}",
            "state": state,
            "ranks": [rank],
            "health": f"http://127.0.0.{rank + 1}:29401",
            "at": 0.0,
        }
        for rank in range(2)
    }
    return job_document(header, records, 2, 0.0)


async def test_a_watch_outlasts_the_stores_trouble_and_ends_with_the_run(capsys):
    answers = [
        view(None, "HEALTHY"),
        StoreUnavailable("127.0.0.1:9: connection refused"),
        view(None, "HEALTHY"),
        view("STOPPED", "STOPPED"),
    ]
    asked: list[float | None] = []

    async def job(every: float | None) -> dict:
        asked.append(every)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    server = HealthCheckServer(lambda: True, 0, 5, job=job)
    await server.start_async()
    try:
        code = await asyncio.to_thread(job_cli.run, server.url, False, 0.1, 5.0, None)
    finally:
        await server.stop_async()
    assert code == 0 and answers == [] and asked == [0.1] * 4
    screens = capsys.readouterr().out.split(job_cli.CLEAR)[1:]
    assert (
        "(the view is not new: the job view needs the store: 127.0.0.1:9: connection "
        in (screens[1])
    )
    assert "HEALTHY" in screens[1]  # the last view stays on the screen meanwhile
    assert (
        screens[3]
        .rstrip()
        .endswith(
            "The run of node 0's agent, which answered, ended: STOPPED. The other rows are as it "
            "last read them. Another node's: "
            "agentd status --job http://127.0.0.2:29401"
        )
    )
