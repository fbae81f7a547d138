"""Crash-propagation worker: ``crash_worker.py OUT_DIR``.

On its agent's first attempt, the worker of group rank 0 stamps ``crash`` and exits 1
after a second; the others stamp ``stopped_<group rank>`` when SIGTERM arrives. Later
attempts exit 0 at once.
"""

import os
import signal
import sys
import time

from report_files import write_report

out = sys.argv[1]
group = os.environ["GROUP_RANK"]
first = os.environ.get("AGENTD_ATTEMPT", os.environ["TORCHELASTIC_RESTART_COUNT"]) == "0"


def stamp(name: str) -> None:
    write_report(os.path.join(out, name), repr(time.time()))


def on_term(signum: int, frame: object) -> None:
    stamp(f"stopped_{group}")
    os._exit(0)


if first and os.path.exists(os.path.join(out, "crash")) is False:
    if group == "0":
        time.sleep(1.0)  # let every node's workers come up
        stamp("crash")
        os._exit(1)
    signal.signal(signal.SIGTERM, on_term)
    time.sleep(60)
