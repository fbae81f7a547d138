"""Benchmark worker: records when it started and at which world size, then runs until a
stop file exists (exit 0).

``member_worker.py OUT_DIR STOP_FILE``. Writes ``member_<pid>.json``:
``{"started": epoch seconds, "world": WORLD_SIZE, "rank": RANK}``.
"""

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from report_files import write_report  # noqa: E402

out, stop = sys.argv[1], sys.argv[2]
path = os.path.join(out, f"member_{os.getpid()}.json")
report = {
    "started": STARTED,
    "world": int(os.environ["WORLD_SIZE"]),
    "rank": int(os.environ["RANK"]),
}
write_report(path, json.dumps(report))
while not os.path.exists(stop):
    time.sleep(0.05)
