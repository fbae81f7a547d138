"""A tiny worker for agentd's tests: ``worker.py MODE [options]``; prints ``ready``.

Writes what tests need into ``$TEST_AGENTD_OUT`` (a directory): ``pid_<rank>_<attempt>``
files with the pids it started and an ``env_<rank>_<attempt>.json`` of its environment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

RANK = int(os.environ.get("LOCAL_RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
OUT = os.environ.get("TEST_AGENTD_OUT")


def note(name: str, content: str) -> None:
    if OUT:
        path = os.path.join(OUT, f"{name}_{RANK}_{ATTEMPT}")
        with open(path + ".tmp", "w") as fp:
            fp.write(content)
        os.replace(path + ".tmp", path)


def ready(*pids: int) -> None:
    note("pid", " ".join(str(p) for p in (os.getpid(), *pids)))
    print("ready", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--rank", type=int, default=0, help="the local rank that misbehaves")
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--after", type=float, default=0.0)
    parser.add_argument("--until-attempt", type=int, default=1)
    parser.add_argument("--message", default="boom")
    parser.add_argument("--crash-group", type=int, default=-1, help="member: its node fails")
    parser.add_argument("--stop-file", default="", help="member: exit 0 once it exists")
    parser.add_argument("--go-file", default="", help="go-then-stop: fail once it exists")
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()

    if args.mode == "member":  # reports its place in the job, runs until --stop-file exists
        place = {
            name: os.environ.get(name)
            for name in (
                "RANK",
                "WORLD_SIZE",
                "GROUP_RANK",
                "GROUP_WORLD_SIZE",
                "MASTER_ADDR",
                "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT",
                "AGENTD_ATTEMPT",
                "ROLE_RANK",
            )
        }
        place.update(PID=str(os.getpid()), STARTED=repr(time.time()))
        note(f"member_a{os.environ.get('AGENTD_ATTEMPT')}", json.dumps(place))
        group = int(os.environ.get("GROUP_RANK", "0"))
        attempt = int(os.environ.get("AGENTD_ATTEMPT", "0"))  # this agent's, restarts or not
        if group == args.crash_group and RANK == args.rank and attempt < args.until_attempt:
            time.sleep(args.after)
            while args.go_file and not os.path.exists(args.go_file):
                time.sleep(0.05)
            return args.code
        while args.stop_file and not os.path.exists(args.stop_file):
            time.sleep(0.05)
        return 0
    if args.mode == "ok":
        print(f"hello from rank {os.environ.get('RANK')}", flush=True)
        print(f"note on stderr from rank {os.environ.get('RANK')}", file=sys.stderr, flush=True)
        return 0
    if args.mode == "env":
        note("env", json.dumps({"env": dict(os.environ), "argv": sys.argv[1:]}))
        return 0
    if args.mode == "chatty":  # fills a log dir, then fails with --code after last words
        for i in range(int(args.after)):
            print(f"out {i:05d} " + "o" * 90, flush=True)
            print(f"err {i:05d} " + "e" * 90, file=sys.stderr, flush=True)
        print("final words", file=sys.stderr, flush=True)
        return args.code
    if args.mode == "go-then-stop":  # attempt 0 fails once --go-file exists; later ones
        go = args.go_file  # run until --stop-file exists
        ready()
        while True:
            if ATTEMPT == 0 and go and os.path.exists(go):
                return 1
            if ATTEMPT > 0 and os.path.exists(args.stop_file):
                return 0
            time.sleep(0.05)
    if args.mode == "limits":  # the open files limit this worker was started with
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        print(f"nofile {soft} {hard}", flush=True)
        ready()
        time.sleep(600)
        return 0
    if args.mode == "print-env":  # what a careless training script does
        print(json.dumps(dict(os.environ)), flush=True)
        return 0
    if args.mode == "sleep":
        ready()
        time.sleep(600)
        return 0
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ready()
        time.sleep(600)
        return 0
    if args.mode == "term-slow":  # exits on SIGTERM after a short cleanup
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.2), sys.exit(0)))
        ready()
        time.sleep(600)
        return 0
    if args.mode == "tree":  # a child in our group and one that escapes into its own session
        inner = subprocess.Popen(["sleep", "600"])
        escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)
        ready(inner.pid, escaped.pid)
        time.sleep(600)
        return 0
    if args.mode == "crash":  # rank --rank exits --code after --after seconds; others sleep
        if RANK == args.rank:
            time.sleep(args.after)
            print(f"rank {RANK} crashing with {args.code}", file=sys.stderr, flush=True)
            return args.code
        ready()
        time.sleep(600)
        return 0
    if args.mode == "crash-holding-pipe":  # exits while a grandchild keeps stderr open
        subprocess.Popen(["sleep", "600"], start_new_session=True)
        ready()
        return args.code
    if args.mode == "flaky":  # fails until the given restart count, then succeeds
        if ATTEMPT < args.until_attempt:
            return args.code
        print(f"succeeded on restart {ATTEMPT}", flush=True)
        return 0
    if args.mode == "record":
        from agentd import record

        @record
        def fail() -> None:
            raise ValueError(args.message)

        fail()
        return 0
    if args.mode == "signal-self":
        os.kill(os.getpid(), signal.SIGKILL)
        return 0
    if args.mode == "ticks":  # --code lines, each with the time it was printed, --after apart
        for i in range(args.code):
            print(f"tick {i} of rank {os.environ.get('RANK')} at {time.time():.3f}", flush=True)
            time.sleep(args.after)
        sys.stdout.write("last words without a newline")
        sys.stdout.flush()
        while args.stop_file and not os.path.exists(args.stop_file):
            time.sleep(0.05)
        return 0
    if args.mode == "lines":  # partial writes that must reach the console as whole lines
        for i in range(3):
            sys.stdout.write(f"part-{i}-a ")
            sys.stdout.flush()
            time.sleep(0.01)
            sys.stdout.write(f"part-{i}-b\n")
            sys.stdout.flush()
        sys.stdout.write("no newline at end")
        return 0
    if args.mode == "timer-hang":  # hangs under a 0.5 s timer until --until-attempt
        from agentd.timer import expires

        with expires(after=0.5):  # the first thing it does: no ready() before the request
            ready()
            if ATTEMPT < args.until_attempt:
                time.sleep(600)
        print(f"finished in time on restart {ATTEMPT}", flush=True)
        return 0
    if args.mode == "torch-timer-hang":  # the same through torch's own client
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires

        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        with expires(after=0.5):
            ready()
            if ATTEMPT < args.until_attempt:
                time.sleep(600)
        print(f"torch timer ok on restart {ATTEMPT}", flush=True)
        return 0
    if args.mode == "timer-foreign":  # asks the agent to kill a pid that is not ours
        path = os.environ["TORCHELASTIC_TIMER_FILE"]
        line = json.dumps(
            {
                "version": 1,
                "pid": args.code,
                "scope_id": "evil",
                "expiration_time": time.time() + 0.1,
                "signal": 9,
            }
        )
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, line.encode() + b"\n")
        os.close(fd)
        time.sleep(1.0)  # long past the foreign timer's deadline
        print("foreign request sent", flush=True)
        return 0
    if args.mode == "timer-garbage":  # garbage and a dangling partial line, then a real timer
        from agentd.timer import expires

        path = os.environ["TORCHELASTIC_TIMER_FILE"]
        holder = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.set_blocking(holder, True)  # the agent drains the pipe as we fill it
        for junk in (
            b"not json\n",
            b"[1,2]\n",
            b'{"version": 2}\n',
            b"x" * 70000 + b"\n",
            b'{"version": 1, "pid": -4}\n',
            b"\xff\xfe\n",
        ):
            os.write(holder, junk)
        os.write(holder, b'{"version": 1, "pid": 12')  # and never finish this line
        ready()
        with expires(after=0.5):
            if ATTEMPT < args.until_attempt:
                time.sleep(600)
        print(f"survived garbage on restart {ATTEMPT}", flush=True)
        return 0
    if args.mode == "timer-dump":  # stack dump on SIGUSR1, then hang under a timer
        import faulthandler

        from agentd.timer import expires

        faulthandler.register(signal.SIGUSR1)
        ready()
        with expires(after=0.3):
            time.sleep(600)
        return 0
    raise SystemExit(f"unknown mode {args.mode}")


if __name__ == "__main__":
    sys.exit(main())
