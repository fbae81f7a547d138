"""Reports what a worker process looks like from inside, for the spawn/preload peer tests.

``introspect.py CODE [ARGS...]``: writes ``report_<local_rank>.json`` to
``$TEST_AGENTD_OUT``, prints one line on stdout and one on stderr, leaves a non-daemon
thread and an atexit handler that must both run, and exits with CODE (``1,0``: 1 on the
first attempt, 0 on the next).
"""

import atexit
import faulthandler
import gc
import json
import multiprocessing
import os
import random
import resource
import signal
import sys
import threading
import time
from pathlib import Path

try:  # first, as a training script imports it: --preload auto forks this script
    import numpy
except ImportError:
    numpy = None

rank = os.environ["LOCAL_RANK"]
out = os.environ["TEST_AGENTD_OUT"]
handlers = {str(int(sig)): repr(signal.getsignal(sig)) for sig in signal.valid_signals()}
rlimits = {
    name: resource.getrlimit(getattr(resource, name))
    for name in dir(resource)
    if name.startswith("RLIMIT_")
}
report = {
    "name": __name__,
    "file": __file__,
    "argv": sys.argv,
    "cmdline": Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").decode().split("\0"),
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "package": __package__,
    "spec": repr(__spec__),
    "main_is_module": sys.modules["__main__"].__dict__ is globals(),
    "env": {
        k: os.environ.get(k)
        for k in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT",
            "PYTHONUNBUFFERED",
            "AGENTD_ATTEMPT",
            "EXTRA_VAR",
            "OMP_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES",
            "PYTHONHASHSEED",
        )
    },
    "session_leader": os.getsid(0) == os.getpid(),
    "group_leader": os.getpgid(0) == os.getpid(),
    "stdin_readable": sys.stdin is not None and sys.stdin.readable(),
    "stdout": [
        sys.stdout.encoding,
        sys.stdout.errors,
        sys.stdout.write_through,
        sys.stdout.line_buffering,
    ],
    "stderr": [
        sys.stderr.encoding,
        sys.stderr.errors,
        sys.stderr.write_through,
        sys.stderr.line_buffering,
    ],
    "handlers": handlers,
    "rlimits": rlimits,
    "umask": os.umask(os.umask(0o022)),
    "nice": os.nice(0),
    "affinity": sorted(os.sched_getaffinity(0)),
    "sys_path_rest": sys.path[1:],
    "flags": repr(sys.flags),
    "dlopen_flags": sys.getdlopenflags(),
    "recursion_limit": sys.getrecursionlimit(),
    "switch_interval": sys.getswitchinterval(),
    "gc": [gc.isenabled(), gc.get_threshold()],
    "faulthandler": faulthandler.is_enabled(),
    "mp_start_method": multiprocessing.get_start_method(allow_none=True),
    "filesystem_encoding": sys.getfilesystemencoding(),
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "main_thread": threading.current_thread() is threading.main_thread(),
    "threads": threading.active_count(),
    "random": random.random(),
    "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) < 3),
    "fds_3_up": len([fd for fd in os.listdir("/proc/self/fd") if int(fd) >= 3]),
}
if numpy is not None:
    report["numpy_random"] = float(numpy.random.random())
with open(os.path.join(out, f"report_{rank}.json"), "w") as fp:
    json.dump(report, fp)


def at_exit() -> None:
    with open(os.path.join(out, f"atexit_{rank}"), "w") as fp:
        fp.write("ran")


def late_thread() -> None:
    time.sleep(0.2)
    with open(os.path.join(out, f"thread_{rank}"), "w") as fp:
        fp.write("joined")


atexit.register(at_exit)
threading.Thread(target=late_thread).start()
print(f"stdout of rank {rank}")
print(f"stderr of rank {rank}", file=sys.stderr)
codes = sys.argv[1].split(",")
sys.exit(int(codes[min(int(os.environ["TORCHELASTIC_RESTART_COUNT"]), len(codes) - 1)]))
