"""A torch-style LocalElasticAgent subclass whose plain ``_start_workers`` calls up.

ELASTIC=<prefix> python calls_super.py PORT
"""

import importlib
import json
import os
import sys

E = os.environ["ELASTIC"]
server = importlib.import_module(f"{E}.agent.server")
local = importlib.import_module(f"{E}.agent.server.local_elastic_agent")
RendezvousParameters = importlib.import_module(f"{E}.rendezvous").RendezvousParameters
get_rendezvous_handler = importlib.import_module(f"{E}.rendezvous.registry").get_rendezvous_handler
DefaultLogsSpecs = importlib.import_module(f"{E}.multiprocessing").DefaultLogsSpecs


class CountingAgent(local.LocalElasticAgent):
    started = []

    def _start_workers(self, worker_group):
        ids = super()._start_workers(worker_group)
        self.started.append(sorted(ids))
        return ids


def main():
    params = RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{sys.argv[1]}",
        run_id="super",
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint=sys.executable,
        args=("-c", "pass"),
        max_restarts=0,
    )
    agent = CountingAgent(spec, DefaultLogsSpecs())
    result = agent.run()
    print(json.dumps({"state": result.state.name, "started": agent.started}))


if __name__ == "__main__":
    main()
