"""A launching script whose trainer function cannot be loaded in the worker: re-run there
as ``__mp_main__`` (multiprocessing's spawn), it raises at import."""

import importlib
import json
import os

if __name__ == "__mp_main__":
    raise RuntimeError("this module refuses to load in a worker")

E = os.environ["ELASTIC"]
server = importlib.import_module(f"{E}.agent.server")
LocalElasticAgent = importlib.import_module(
    f"{E}.agent.server.local_elastic_agent"
).LocalElasticAgent


def trainer():
    return 1


if __name__ == "__main__":
    spec = server.WorkerSpec(role="t", local_world_size=1, entrypoint=trainer, max_restarts=0)
    result = LocalElasticAgent(spec).run()
    root = min(result.failures.values(), key=lambda f: f.timestamp)
    print(json.dumps({"state": result.state.name, "message": str(root.message)}))
