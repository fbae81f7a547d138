"""A torch-style SimpleElasticAgent subclass: plain (sync) step methods.

    ELASTIC=<prefix> python subclass.py MODE PORT

MODE ``ok``: the monitor reports HEALTHY four times, then SUCCEEDED; ``raise``: the
monitor has a bug (raises ValueError). Prints what the agent did.
"""

import importlib
import json
import os
import signal
import sys
import threading
import time

E = os.environ["ELASTIC"]
server = importlib.import_module(f"{E}.agent.server")
RendezvousParameters = importlib.import_module(f"{E}.rendezvous").RendezvousParameters
get_rendezvous_handler = importlib.import_module(f"{E}.rendezvous.registry").get_rendezvous_handler


class MyAgent(server.SimpleElasticAgent):
    def __init__(self, spec, mode):
        super().__init__(spec)
        self.mode = mode
        self.monitor_times = []
        self.started_on_main_thread = []
        self.stopped = 0
        self.shutdowns = 0

    def _start_workers(self, worker_group):
        self.started_on_main_thread.append(threading.current_thread() is threading.main_thread())
        return {w.local_rank: 1000 + w.local_rank for w in worker_group.workers}

    def _stop_workers(self, worker_group, is_restart=False):
        self.stopped += 1

    def _monitor_workers(self, worker_group):
        self.monitor_times.append(time.monotonic())
        if self.mode == "raise":
            raise ValueError("a bug in _monitor_workers")
        if len(self.monitor_times) < 5:
            return server.RunResult(state=server.WorkerState.HEALTHY)
        return server.RunResult(
            state=server.WorkerState.SUCCEEDED, return_values={0: "done", 1: "done"}
        )

    def _shutdown(self, death_sig=signal.SIGTERM, timeout=30):  # torch 2.13
        self.shutdowns += 1


def main():
    mode, port = sys.argv[1], sys.argv[2]
    params = RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{port}",
        run_id="subclass",
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    spec = server.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        entrypoint="unused",
        monitor_interval=0.1,
    )
    agent = MyAgent(spec, mode)
    out = {}
    try:
        result = agent.run()
        out.update(
            state=result.state.name, values={str(k): v for k, v in result.return_values.items()}
        )
    except ValueError as exc:
        import traceback

        out.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    times = agent.monitor_times
    out.update(
        calls=len(times),
        span=times[-1] - times[0] if times else 0.0,
        started_on_main_thread=agent.started_on_main_thread,
        shutdowns=agent.shutdowns,
        ids=[w.id for w in agent.get_worker_group().workers],
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
