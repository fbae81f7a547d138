"""Writes ``w<WORLD_SIZE>_<RANK>_<restart count>`` to OUT_DIR, then idles until STOP exists.

``world_loop.py OUT_DIR STOP``: a worker that shows which world each round gave it.
"""

import os
import sys
import time

out, stop = sys.argv[1], sys.argv[2]
env = os.environ
name = f"w{env['WORLD_SIZE']}_{env['RANK']}_{env['TORCHELASTIC_RESTART_COUNT']}"
with open(os.path.join(out, name), "w") as fp:
    fp.write(str(os.getpid()))
while not os.path.exists(stop):
    time.sleep(0.05)
