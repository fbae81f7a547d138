"""The named-pipe protocol: parsing, bad input, and a real FIFO."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import stat
import subprocess
import sys
import time

import pytest

from agentd.exceptions import StartError
from agentd.timer import FileTimerClient, expires
from agentd.timer.api import RELEASE, TimerRequest
from agentd.timer.file_pipe import BadRequest, encode_request, parse_line, parse_request
from agentd.timer.file_server import FileTimerServer


def wire(**kw) -> bytes:
    doc = {"version": 1, "pid": 42, "scope_id": "s", "expiration_time": 12.5, "signal": 9}
    doc.update(kw)
    return json.dumps(doc).encode()


def test_round_trip_matches_torch_format():
    request = TimerRequest(42, "train.py#7", 1700000000.25, 9)
    line = encode_request(request)
    assert json.loads(line) == {
        "version": 1,
        "pid": 42,
        "scope_id": "train.py#7",
        "expiration_time": 1700000000.25,
        "signal": 9,
    }
    assert parse_request(line.rstrip(b"\n")) == request
    assert parse_request(wire(expiration_time=-1)).expiration_time == RELEASE


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        (b"nope", "not JSON"),
        (b"[1]", "not a JSON object"),
        (wire(version=3), "version: 3 must be 1 (a timer request"),
        (wire(version=2), "kind: None must be one of beat, enter, exit, done, parked"),
        (wire(pid=0), "pid: 0 must be a positive integer"),
        (wire(pid=True), "pid: True"),
        (wire(pid="42"), "pid: '42'"),
        (wire(scope_id=5), "scope_id"),
        (wire(scope_id="x" * 2000), "scope_id"),
        (wire(expiration_time="soon"), "expiration_time: 'soon'"),
        (
            b'{"version": 1, "pid": 42, "scope_id": "s", "expiration_time": NaN}',
            "nan must be -1 or epoch",
        ),
        (wire(signal=999), "signal: 999"),
        (wire(signal=-(2**70)), "signal: -1180591620717411303424"),
        (wire(pid=2**31), "pid: 2147483648 must be a positive integer"),
        (wire(pid=2**64), "pid: 18446744073709551616 must be a positive integer"),
        (
            b'{"version": 1, "pid": 42, "scope_id": "s", "expiration_time": 1' + b"0" * 400 + b"}",
            "expiration_time: <a 401-digit integer> must be -1 or",
        ),
        (wire(expiration_time=-5), "expiration_time: -5 must be -1 or"),
    ],
)
def test_bad_requests_name_the_rule(line, rule):
    with pytest.raises(BadRequest, match=rule.replace("(", r"\(")):
        parse_request(line)


def test_request_glued_to_a_partial_line_is_recovered():
    request, problem = parse_line(b'{"version": 1, "pid": 12' + wire(scope_id="a{b}"))
    assert request is not None and request.scope_id == "a{b}"
    assert "stray bytes" in problem
    assert parse_line(b"garbage") == (None, "not JSON")


def test_oversized_request_is_refused_by_the_client():
    with pytest.raises(ValueError, match="the pipe takes"):
        encode_request(TimerRequest(1, "x" * 5000, 1.0))


async def write_all(fd: int, data: bytes) -> None:
    """Write to a non-blocking pipe, letting the server's loop drain it when full."""
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            await asyncio.sleep(0.001)


async def test_fifo_end_to_end_with_garbage_and_a_stuck_writer(tmp_path):
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    server = FileTimerServer(
        str(tmp_path / "timer.fifo"),
        trust=lambda pid: os.getpgid(pid) if pid == child.pid else None,
    )
    await server.start_async()
    holder = None
    try:
        assert stat.S_ISFIFO(os.stat(server.path).st_mode)
        holder = os.open(server.path, os.O_WRONLY | os.O_NONBLOCK)
        await write_all(holder, b"garbage\n" + b"y" * 100_000 + b"\n[]\n")
        await write_all(holder, b'{"version": 1, "pid"')  # never finishes this line
        client = FileTimerClient(server.path)
        # the client's pid is ours, not the child's: write the child's request by hand
        line = encode_request(TimerRequest(child.pid, "hang", time.time() + 0.05))
        fd = os.open(server.path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, line)
        os.close(fd)
        async with asyncio.timeout(10):
            while child.poll() is None:
                await asyncio.sleep(0.005)
        assert child.returncode == -9
        assert server.stats["invalid"] >= 2 and server.stats["oversized"] >= 1
        client.release("nothing")  # releasing an unknown scope is harmless
    finally:
        if holder is not None:
            os.close(holder)
        await server.stop_async()
        child.kill()
        child.wait()
    assert not os.path.exists(tmp_path / "timer.fifo")  # we made it, we removed it


async def test_requests_read_with_overflowing_ones_are_all_honoured(tmp_path):
    """pid 2**31, pid 2**64 and a 400-digit deadline once raised OverflowError in the reader
    and took the valid requests of the same read down with them."""
    pids: set[int] = set()
    server = FileTimerServer(
        str(tmp_path / "timer.fifo"), trust=lambda pid: os.getpgid(pid) if pid in pids else None
    )
    children = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    pids.update(c.pid for c in children)
    await server.start_async()
    try:
        soon = time.time() + 0.05
        chunk = b"".join(
            [
                encode_request(TimerRequest(children[0].pid, "a", soon)),
                wire(pid=2**31) + b"\n",
                wire(pid=2**64) + b"\n",
                b'{"version": 1, "pid": 42, "scope_id": "s", "expiration_time": 1'
                + b"0" * 400
                + b"}\n",
                encode_request(TimerRequest(children[1].pid, "b", soon)),
            ]
        )
        fd = os.open(server.path, os.O_WRONLY | os.O_NONBLOCK)
        await write_all(fd, chunk)  # one write: the server reads it in one go
        os.close(fd)
        async with asyncio.timeout(10):
            while any(c.poll() is None for c in children):
                await asyncio.sleep(0.005)
        assert [c.returncode for c in children] == [-9, -9]
        assert server.stats["invalid"] == 3
    finally:
        await server.stop_async()
        for child in children:
            child.kill()
            child.wait()


async def test_one_worker_cannot_hold_more_than_its_share_of_timers(tmp_path):
    pids: set[int] = set()
    server = FileTimerServer(
        str(tmp_path / "timer.fifo"),
        max_timers_per_worker=100,
        trust=lambda pid: os.getpgid(pid) if pid in pids else None,
    )
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    pids.add(child.pid)
    await server.start_async()
    try:
        later = time.time() + 3600
        lines = b"".join(
            encode_request(TimerRequest(child.pid, f"s{i}", later)) for i in range(5000)
        )
        fd = os.open(server.path, os.O_WRONLY | os.O_NONBLOCK)
        await write_all(fd, lines)
        async with asyncio.timeout(10):
            while server.stats["acquired"] + server.stats["capped"] < 5000:
                await asyncio.sleep(0.005)
        assert len(server) == 100 and server.stats["capped"] == 4900
        os.write(fd, encode_request(TimerRequest(child.pid, "s0", later + 1)))  # a renewal
        os.write(fd, encode_request(TimerRequest(child.pid, "s1", RELEASE)))
        os.write(fd, encode_request(TimerRequest(child.pid, "new", later)))  # room again
        os.close(fd)
        async with asyncio.timeout(10):
            while server.stats["acquired"] < 102:
                await asyncio.sleep(0.005)
        assert len(server) == 100 and server.stats["capped"] == 4900
        server.clear_timers([child.pid])
        assert len(server) == 0
    finally:
        await server.stop_async()
        child.kill()
        child.wait()


async def test_private_fifo_is_0600_in_a_0700_dir():
    server = FileTimerServer(None)
    await server.start_async()
    try:
        assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(server.path)).st_mode) == 0o700
    finally:
        await server.stop_async()
    assert not os.path.exists(os.path.dirname(server.path))


async def test_existing_regular_file_is_refused_not_deleted(tmp_path):
    path = tmp_path / "not-a-fifo"
    path.write_text("precious")
    server = FileTimerServer(str(path))
    with pytest.raises(StartError, match="not a named pipe owned by uid"):
        await server.start_async()
    assert path.read_text() == "precious"


async def test_client_without_server_fails_clearly(tmp_path):
    path = tmp_path / "dead.fifo"
    os.mkfifo(path)  # a pipe nobody reads
    with pytest.raises(BrokenPipeError, match="is not available"):
        FileTimerClient(str(path)).acquire("s", time.time() + 1)


def test_expires_without_a_client_says_how_to_get_one(monkeypatch):
    import agentd.timer.default_client as api

    monkeypatch.setattr(api, "_client", None)
    monkeypatch.delenv("TORCHELASTIC_TIMER_FILE", raising=False)
    with pytest.raises(RuntimeError, match="--file-timer"), expires(after=1):
        pass


def test_local_timer_client_and_server_through_an_mp_queue():
    code = """
import asyncio, multiprocessing as mp, subprocess, time
from agentd.timer import LocalTimerClient, LocalTimerServer
from agentd.timer.api import TimerRequest
async def main():
    q = mp.Queue()
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    server = LocalTimerServer(q, trust=lambda pid: pid if pid == child.pid else None)
    await server.start_async()
    LocalTimerClient(q).release("nothing")  # the client's own requests travel the same way
    q.put(TimerRequest(child.pid, "s", time.time() + 0.05))  # as the child would, for itself
    async with asyncio.timeout(10):
        while child.poll() is None:
            await asyncio.sleep(0.005)
    await server.stop_async()
    print(child.returncode)
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "-9", out.stderr


def test_the_pipe_dirs_of_agents_that_are_gone_are_swept(tmp_path):
    """An agent SIGKILLed before its guardian started leaves its private pipe directory;
    the next agent to make one removes it, and nothing else."""
    from agentd.hygiene.orphans import process_start_ticks
    from agentd.timer.pipe import sweep_stale_pipe_dirs

    gone = subprocess.Popen(["true"])
    gone.wait()

    def pipe_dir(name: str, fifo: bool = True) -> pathlib.Path:
        folder = tmp_path / name
        folder.mkdir()
        if fifo:
            os.mkfifo(folder / "timer.fifo")
        else:
            (folder / "notes.txt").write_text("keep me")
        return folder

    ticks = process_start_ticks(os.getpid())
    stale = pipe_dir(f"agentd-timer-{gone.pid}.12345-abc")
    live = pipe_dir(f"agentd-timer-{os.getpid()}.{ticks}-def")
    reused = pipe_dir(f"agentd-timer-{os.getpid()}.{ticks + 1}-jkl")  # our pid, not us
    not_only_fifos = pipe_dir(f"agentd-timer-{gone.pid}.12345-ghi", fifo=False)
    old_name = pipe_dir("agentd-timer-xyz")
    assert sorted(sweep_stale_pipe_dirs(str(tmp_path))) == sorted([str(stale), str(reused)])
    assert not stale.exists() and not reused.exists()
    assert live.exists() and not_only_fifos.exists() and old_name.exists()


def test_another_pid_namespaces_pipe_dirs_are_judged_by_their_lock(tmp_path):
    """A directory named by an agent of another PID namespace (a container sharing /tmp):
    its pid means nothing here, so it is swept only once nobody holds its lock and it is
    older than FOREIGN_GRACE (its agent locks it just after making it); ours are judged by
    pid as before. A live one that looked dead here was swept under its agent."""
    from agentd.hygiene.orphans import (
        agent_identity,
        parse_identity,
        pid_namespace,
        process_start_ticks,
    )
    from agentd.timer.pipe import FOREIGN_GRACE, sweep_stale_pipe_dirs
    from tests.helpers.lock_holder import lock_holder

    gone = subprocess.Popen(["true"])
    gone.wait()
    elsewhere = pid_namespace() + 1
    old = time.time() - FOREIGN_GRACE - 1

    def pipe_dir(name: str, age: float | None = None) -> pathlib.Path:
        folder = tmp_path / name
        folder.mkdir()
        os.mkfifo(folder / "timer.fifo")
        if age is not None:
            os.utime(folder, (age, age))
        return folder

    held = pipe_dir(f"agentd-timer-{gone.pid}.1.{elsewhere}-held", old)
    young = pipe_dir(f"agentd-timer-{gone.pid}.1.{elsewhere}-young")
    dead = pipe_dir(f"agentd-timer-{os.getpid()}.1.{elsewhere}-dead", old)  # our pid, not us
    ours_gone = pipe_dir(f"agentd-timer-{gone.pid}.1.{pid_namespace()}-gone")
    ours_live = pipe_dir(f"agentd-timer-{agent_identity()}-live")
    with lock_holder(str(held)) as agent:  # a live agent there (its pid, here, is nobody's)
        assert sorted(sweep_stale_pipe_dirs(str(tmp_path))) == sorted([str(dead), str(ours_gone)])
        assert held.exists() and young.exists() and ours_live.exists()
        agent.kill()
        agent.wait()
    assert sweep_stale_pipe_dirs(str(tmp_path)) == [str(held)]  # its agent is gone
    assert parse_identity(agent_identity()) == (
        os.getpid(),
        process_start_ticks(os.getpid()),
        pid_namespace(),
    )


async def test_last_progress_stops_at_the_deadline_a_blocked_loop_missed(tmp_path):
    """torch's ``get_last_progress_time`` for an event-driven watchdog: now while it
    keeps its deadlines, the second of the one it missed while its loop is blocked, and
    the second it stopped once stopped (a health check's alive callback sees it stale)."""
    server = FileTimerServer(str(tmp_path / "timer.fifo"), max_overdue=0.1)
    await server.start_async()
    try:
        due = time.time() + 0.05
        server.register_timers([TimerRequest(os.getpid(), "work", due)])  # never reaped: ours
        assert 0 <= time.time() - server.get_last_progress_time() < 2  # (the second: floored)
        time.sleep(0.4)  # the loop blocked: the deadline passes unmet  # noqa: ASYNC251
        assert abs(server.get_last_progress_time() - due) <= 1
        assert time.time() - server.get_last_progress_time() >= 0.3
    finally:
        await server.stop_async()
    stopped = server.get_last_progress_time()
    # an epoch second, floored: up to a second behind, and more at a second's turn (CI,
    # 2026-12-02: 1.0002 s)
    assert 0 <= time.time() - stopped < 2
