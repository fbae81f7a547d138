"""torch's launcher API as its documentation writes it: ``elastic_launch(config, fn)(args)``.

    ELASTIC=<prefix> LAUNCHER=<module> python launch.py MODE PORT

MODE ``ok``: every rank returns rank * 10. ``fail``: rank 1 raises. The launching main is
decorated with ``@record``, so with TORCHELASTIC_ERROR_FILE set the root cause lands there.
"""

import importlib
import json
import os
import sys

E, L = os.environ["ELASTIC"], os.environ["LAUNCHER"]
launcher = importlib.import_module(L)
errors = importlib.import_module(f"{E}.multiprocessing.errors")


def worker_fn(mode):
    rank = int(os.environ["RANK"])
    if mode == "fail" and rank == 1:
        raise RuntimeError("rank 1 gave up")
    return rank * 10


@errors.record
def main():
    mode, port = sys.argv[1], sys.argv[2]
    config = launcher.LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        run_id="launch",
        max_restarts=0,
        monitor_interval=0.1,
    )
    try:
        outputs = launcher.elastic_launch(config, worker_fn)(mode)
    except errors.ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        print(json.dumps({"failed_rank": rank, "message": str(failure.message), "text": str(exc)}))
        raise
    print(json.dumps({"outputs": {str(k): v for k, v in outputs.items()}}))


if __name__ == "__main__":
    main()
