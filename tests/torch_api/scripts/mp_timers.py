"""A user's own multiprocessing children under a LocalTimerServer, as torch's timer
tests and examples write it: even ranks overrun their timer, odd ones finish in time.

    ELASTIC=<prefix> python mp_timers.py START_METHOD
"""

import importlib
import json
import multiprocessing as mp
import os
import sys
import time

timer = importlib.import_module(f"{os.environ['ELASTIC']}.timer")


def child(rank, queue):
    timer.configure(timer.LocalTimerClient(queue))
    with timer.expires(after=1):
        time.sleep(30 if rank % 2 == 0 else 0.1)


def main():
    ctx = mp.get_context(sys.argv[1])
    queue = ctx.Queue()
    server = timer.LocalTimerServer(queue, max_interval=0.01)
    server.start()
    procs = [ctx.Process(target=child, args=(rank, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    server.stop()
    print(json.dumps({"exitcodes": [proc.exitcode for proc in procs]}))


if __name__ == "__main__":
    main()
