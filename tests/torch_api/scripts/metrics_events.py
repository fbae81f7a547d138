"""A site's metric handler and event handler, installed the torch way, around a run.

    ELASTIC=<prefix> python metrics_events.py MODE PORT

MODE ``ok`` (both workers exit 0) or ``fail`` (rank 1 exits 3; no restarts).
"""

import importlib
import json
import logging
import os
import sys

E = os.environ["ELASTIC"]
metrics = importlib.import_module(f"{E}.metrics")
server = importlib.import_module(f"{E}.agent.server")
local = importlib.import_module(f"{E}.agent.server.local_elastic_agent")
RendezvousParameters = importlib.import_module(f"{E}.rendezvous").RendezvousParameters
get_rendezvous_handler = importlib.import_module(f"{E}.rendezvous.registry").get_rendezvous_handler
DefaultLogsSpecs = importlib.import_module(f"{E}.multiprocessing").DefaultLogsSpecs


class Collect(metrics.MetricHandler):
    def __init__(self):
        self.seen = {}

    def emit(self, metric_data):
        self.seen[metric_data.name] = metric_data.value


class Events(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        self.names.append(json.loads(record.getMessage())["name"])


def main():
    mode, port = sys.argv[1], sys.argv[2]
    collect, events = Collect(), Events()
    metrics.configure(collect)
    logging.getLogger("torchelastic-events-null").addHandler(events)
    code = (
        "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' and sys.argv[1] == 'fail' else 0)"
    )
    params = RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{port}",
        run_id="me",
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=sys.executable,
        args=("-c", code, mode),
        max_restarts=0,
    )
    agent = local.LocalElasticAgent(spec, DefaultLogsSpecs())
    result = agent.run()
    with agent.record_duration("TIMED"):  # as a subclass times a step of its own
        pass
    print(json.dumps({"state": result.state.name, "metrics": collect.seen, "events": events.names}))


if __name__ == "__main__":
    main()
