"""Benchmark worker for timers: ``timer_worker.py agentd|torch OUT_DIR LAST_ATTEMPT``.

Local rank 0 acquires a timer due at a random phase 0.3-0.8 s ahead, writes its pid,
deadline and sibling's pid to ``OUT_DIR/timer_<restart>``, and hangs; the other ranks hang.
On attempt LAST_ATTEMPT every rank exits 0 at once.
"""

import json
import os
import random
import sys
import time

from report_files import write_report

impl, out, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
rank = int(os.environ["LOCAL_RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if restart >= last:
    sys.exit(0)
if rank != 0:
    write_report(os.path.join(out, f"sibling_{restart}"), str(os.getpid()))
    time.sleep(120)
    sys.exit(0)
if impl == "torch":
    from torch.distributed.elastic.timer import FileTimerClient
else:
    from agentd.timer import FileTimerClient
client = FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"])
deadline = time.time() + 0.3 + random.random() * 0.5
client.acquire("bench", deadline)
write_report(
    os.path.join(out, f"timer_{restart}"), json.dumps({"pid": os.getpid(), "deadline": deadline})
)
time.sleep(120)
