"""The worker side of hang detection: ``agentd.heartbeat()``, ``section``, ``end_heartbeats``.

Each case runs a real worker process against a real named pipe read by the test (as the
agent reads it), so the module starts fresh and the wire is the real one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

from agentd.heartbeats import DUMP_SIGNAL
from agentd.wire.progress import DUMP_SIGNAL_ENV, PIPE_ENV, STACK_FILE_ENV


def run_worker(code: str, env: dict[str, str], **kwargs) -> subprocess.Popen[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in (PIPE_ENV, STACK_FILE_ENV, DUMP_SIGNAL_ENV)
    }
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**clean, **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


@pytest.fixture
def pipe(tmp_path):
    path = tmp_path / "progress.fifo"
    os.mkfifo(path, 0o600)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    yield path, fd
    os.close(fd)


def read_messages(fd: int, until: int, deadline: float = 20.0) -> list[dict]:
    """Messages from the pipe until ``until`` of them came (or the deadline passed)."""
    data = b""
    end = time.monotonic() + deadline
    while data.count(b"\n") < until and time.monotonic() < end:
        select.select([fd], [], [], 0.1)
        try:
            data += os.read(fd, 65536)
        except BlockingIOError:
            continue
    return [json.loads(line) for line in data.splitlines()]


def test_without_an_agent_every_call_is_a_silent_no_op():
    code = (
        "import agentd\nfor _ in range(100000): agentd.heartbeat()\n"
        "with agentd.section('checkpoint'): pass\nagentd.end_heartbeats()\nprint('ok')"
    )
    proc = run_worker(code, {})
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, "ok\n", "")


def test_heartbeats_are_rate_limited_and_carry_the_step_count(pipe):
    path, fd = pipe
    code = (
        "import agentd, time\nfor _ in range(1000): agentd.heartbeat()\n"
        "time.sleep(0.3)\nagentd.heartbeat()\n"
        "with agentd.section('checkpoint'): pass\nagentd.end_heartbeats()"
    )
    proc = run_worker(code, {PIPE_ENV: str(path)})
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (0, "")
    messages = read_messages(fd, until=6)
    kinds = [(m["kind"], m["steps"], m.get("section")) for m in messages]
    assert kinds == [
        ("beat", 1, None),
        ("beat", 1001, None),
        ("enter", 1001, "checkpoint"),
        ("exit", 1001, "checkpoint"),
        ("done", 1001, None),
        ("enter", 1001, "shutdown"),  # the interpreter's exit
    ]
    assert {m["pid"] for m in messages} == {proc.pid}
    assert messages[1]["at"] - messages[0]["at"] >= 0.25
    assert all(m["version"] == 2 for m in messages)


def test_the_first_message_registers_the_stack_dump_on_the_agents_signal(pipe, tmp_path):
    path, fd = pipe
    stacks = tmp_path / "stacks.txt"
    code = (
        "import agentd, time\ndef hang():\n    time.sleep(60)\nagentd.heartbeat()\n"
        "print('hanging', flush=True)\nhang()"
    )
    env = {PIPE_ENV: str(path), STACK_FILE_ENV: str(stacks), DUMP_SIGNAL_ENV: str(DUMP_SIGNAL)}
    proc = run_worker(code, env)
    try:
        [first] = read_messages(fd, until=1)
        assert first["dump_signal"] == DUMP_SIGNAL
        assert proc.stdout is not None and proc.stdout.readline() == "hanging\n"
        # after "hanging" the worker still has to call hang() and reach its sleep: on a
        # loaded machine a dump can catch it on the line before, or entering hang() (its
        # "def" line, CI: "line 2 in hang"), so the signal is sent until one shows it in
        # the sleep (each dump is appended; the process is never killed by one)
        sleeping = 'File "<string>", line 3 in hang'
        end = time.monotonic() + 20
        while sleeping not in stacks.read_text() and time.monotonic() < end:
            size = len(stacks.read_text())
            os.kill(proc.pid, first["dump_signal"])
            while len(stacks.read_text()) == size and time.monotonic() < end:
                time.sleep(0.02)
        assert sleeping in stacks.read_text()
        assert proc.poll() is None  # dumped, not killed
    finally:
        proc.kill()
        proc.communicate()


def test_a_bad_section_name_is_refused_naming_the_rule():
    import agentd

    with pytest.raises(ValueError, match="section: '' must be a non-empty string of at most"):
        agentd.section("")
    with pytest.raises(ValueError, match="section: 7 must be"):
        agentd.section(7)  # type: ignore[arg-type]


def test_an_agent_that_is_gone_turns_heartbeats_off_with_one_line(tmp_path):
    path = tmp_path / "progress.fifo"
    os.mkfifo(path, 0o600)  # no reader: the agent that made it is gone
    code = (
        "import agentd\nfor _ in range(3): agentd.heartbeat()\n"
        "with agentd.section('x'): pass\nprint('trained')"
    )
    proc = run_worker(code, {PIPE_ENV: str(path)})
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "trained\n")
    assert err.count("\n") == 1
    assert err.startswith(f"agentd.heartbeats.client: cannot reach the agent at {path}")


def test_a_heartbeat_costs_well_under_two_microseconds_when_nothing_is_sent(pipe):
    """A loose bound (the benchmark measures it): 20 µs even on a loaded machine."""
    path, _ = pipe
    code = (
        "import agentd, time\nagentd.heartbeat()\nn = 200000\nt = time.perf_counter()\n"
        "for _ in range(n): agentd.heartbeat()\nprint((time.perf_counter() - t) / n)"
    )
    proc = run_worker(code, {PIPE_ENV: str(path)})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert float(out) < 20e-6


def test_every_message_names_the_dump_signal(pipe, tmp_path):
    """The agent may read a worker's later message first (it drops what arrives before it
    knows the worker), so each one says how to ask for a dump."""
    path, fd = pipe
    code = "import agentd, time\nagentd.heartbeat()\ntime.sleep(0.3)\nagentd.heartbeat()"
    env = {
        PIPE_ENV: str(path),
        STACK_FILE_ENV: str(tmp_path / "stacks.txt"),
        DUMP_SIGNAL_ENV: str(DUMP_SIGNAL),
    }
    proc = run_worker(code, env)
    proc.communicate(timeout=60)
    messages = read_messages(fd, until=3)
    assert [m["dump_signal"] for m in messages] == [DUMP_SIGNAL] * 3  # beat, beat, shutdown


def test_only_the_worker_itself_enters_shutdown_at_exit_not_a_child_it_forked(pipe):
    """A child forked after the first heartbeat (that exits through the interpreter, as
    a plain os.fork child may) inherits the exit hook; its pid is no worker's, so it
    sends nothing at exit."""
    path, fd = pipe
    code = (
        "import agentd, os, sys\nagentd.heartbeat()\npid = os.fork()\n"
        "if pid == 0:\n    sys.exit(0)\nos.waitpid(pid, 0)\nprint('parent')"
    )
    proc = run_worker(code, {PIPE_ENV: str(path)})
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, "parent\n", "")
    messages = read_messages(fd, until=3, deadline=2.0)
    assert [(m["kind"], m["pid"]) for m in messages] == [("beat", proc.pid), ("enter", proc.pid)]
