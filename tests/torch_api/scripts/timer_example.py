"""The expiration-timer example of torch's documentation, as a torch user completes it:
a LocalTimerServer on an mp Queue, a trainer function defined in this script, passed with
``fn=`` and the queue in ``args``, and ``agent.run()``.

    ELASTIC=<prefix> python timer_example.py AFTER WORK PORT [doc]

``doc`` builds the agent as the documentation writes it, ``LocalElasticAgent(spec,
start_method)`` (torch 2.13 itself takes a LogsSpecs there).
"""

import importlib
import json
import multiprocessing as mp
import os
import sys
import time

E = os.environ["ELASTIC"]
timer = importlib.import_module(f"{E}.timer")
agent = importlib.import_module(f"{E}.agent.server")
LocalElasticAgent = importlib.import_module(
    f"{E}.agent.server.local_elastic_agent"
).LocalElasticAgent
DefaultLogsSpecs = importlib.import_module(f"{E}.multiprocessing").DefaultLogsSpecs
RendezvousParameters = importlib.import_module(f"{E}.rendezvous").RendezvousParameters
get_rendezvous_handler = importlib.import_module(f"{E}.rendezvous.registry").get_rendezvous_handler


def trainer_func(message_queue, after, work):
    timer.configure(timer.LocalTimerClient(message_queue))
    with timer.expires(after=after):
        time.sleep(work)  # do some work
    return os.getpid()


def main():
    after, work, port = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    start_method = "spawn"
    message_queue = mp.get_context(start_method).Queue()
    server = timer.LocalTimerServer(message_queue, max_interval=0.01)
    server.start()  # non-blocking
    params = RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{port}",
        run_id="timer-example",
        min_nodes=1,
        max_nodes=1,
        rank=0,
    )
    spec = agent.WorkerSpec(
        role="trainer",
        local_world_size=2,
        rdzv_handler=get_rendezvous_handler(params),
        fn=trainer_func,
        args=(message_queue, after, work),
        max_restarts=0,
    )
    if sys.argv[4:] == ["doc"]:
        elastic_agent = LocalElasticAgent(spec, start_method)
    else:
        elastic_agent = LocalElasticAgent(spec, DefaultLogsSpecs(), start_method)
    result = elastic_agent.run()
    server.stop()
    print(
        json.dumps(
            {
                "state": result.state.name,
                "ranks": sorted(result.return_values),
                "pids": sorted(v for v in result.return_values.values() if v),
                "exitcodes": sorted(f.exitcode for f in result.failures.values()),
            }
        )
    )


if __name__ == "__main__":
    main()
