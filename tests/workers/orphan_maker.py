"""Leaves an orphan behind (double fork) and reports whether PID 1 reaped it."""

import os
import subprocess
import sys
import time

inner = "import subprocess; print(subprocess.Popen(['sleep', '0.1']).pid, flush=True)"
orphan = int(
    subprocess.run([sys.executable, "-c", inner], capture_output=True, text=True, check=True).stdout
)
deadline = time.monotonic() + 20
while os.path.exists(f"/proc/{orphan}"):  # a zombie keeps its /proc entry until reaped
    if time.monotonic() > deadline:
        print(f"orphan {orphan} NOT reaped", flush=True)
        sys.exit(1)
    time.sleep(0.01)
print(f"orphan {orphan} reaped; agent is pid {os.getppid()}", flush=True)
print("ready", flush=True)
time.sleep(600)
