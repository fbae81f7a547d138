"""A worker that heartbeats about --rate times a second for --seconds, then reports the
CPU cost of a heartbeat() call and of a section (enter and exit) in its own process
(``OUT/cost_<rank>.json``).

``beat_worker.py OUT --rate 1000 --seconds 10 [--no-beats]``
"""

import argparse
import json
import os
import time
from pathlib import Path

from report_files import write_report

import agentd

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--rate", type=float, default=1000.0)
parser.add_argument("--seconds", type=float, default=10.0)
parser.add_argument("--no-beats", action="store_true")
args = parser.parse_args()
rank = os.environ.get("RANK", "0")

period = 1.0 / args.rate
end = time.monotonic() + args.seconds
beats = 0
next_at = time.monotonic()
while time.monotonic() < end:
    next_at += period
    if not args.no_beats:
        agentd.heartbeat()
        beats += 1
    delay = next_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)

# CPU time of this process, not wall time: four workers share two cores here.
calls = 1_000_000
started = time.process_time()
for _ in range(calls):
    agentd.heartbeat()
per_call = (time.process_time() - started) / calls
started = time.process_time()
for _ in range(10_000):
    with agentd.section("bench"):
        pass
per_section = (time.process_time() - started) / 10_000
agentd.end_heartbeats()
doc = {"beats": beats, "heartbeat_ns": per_call * 1e9, "section_us": per_section * 1e6}
write_report(Path(args.out) / f"cost_{rank}.json", json.dumps(doc))
