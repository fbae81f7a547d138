"""The worker of the defaults matrix: a test worker with torch imported at module level.

``torch_worker.py MODE [options]`` is worker.py's ``MODE``; ``torch_worker.py SCRIPT.py
[args]`` runs another test worker (heartbeat_job.py, ...) as ``__main__``. Under the
default ``--preload auto`` the agent forks it from a zygote that preloaded torch; under
``--no-preload`` it is spawned.
"""

import runpy
import sys

import torch  # noqa: F401  (what makes --preload auto fork)

if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1].endswith(".py"):
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        import worker  # tests/workers is sys.path[0]

        sys.exit(worker.main())
