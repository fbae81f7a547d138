"""recovery_worker.py's job, in a script whose first import beyond the standard library is
Lightning, as a Lightning script's is (``bench_recovery.py --library lightning``):
``--preload auto`` then preloads Lightning, and each worker started anew imports it (7-8 s
of CPU on 2 cores) unless it is forked."""

import runpy
from pathlib import Path

import lightning  # noqa: F401

runpy.run_path(str(Path(__file__).with_name("recovery_worker.py")), run_name="__main__")
