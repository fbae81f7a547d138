"""Benchmark worker: records when it started running; then exits, sleeps or crashes.

``worker.py MODE OUT_DIR``. Writes ``start_<restart>_<rank>`` (epoch seconds at the first
line of the script). Modes: ``exit`` (return at once), ``sleep SECONDS``, ``crash`` (on
the first attempt, rank 0 writes ``crash_0`` and exits 1; the others sleep).
"""

import time

STARTED = time.time()

import os  # noqa: E402
import sys  # noqa: E402

from report_files import write_report  # noqa: E402


def stamp(name: str, value: float) -> None:
    write_report(os.path.join(sys.argv[2], name), repr(value))


rank = os.environ["LOCAL_RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
stamp(f"start_{restart}_{rank}", STARTED)
mode = sys.argv[1]
if mode == "sleep":
    time.sleep(float(sys.argv[3]))
elif mode == "crash" and restart == "0":
    if rank == "0":
        time.sleep(0.5)  # let the whole group come up first
        stamp("crash_0", time.time())
        sys.exit(1)
    time.sleep(60)
