"""Timer logic with an injected clock: fast and deterministic."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

from agentd.timer.api import RELEASE, TimerRequest
from agentd.timer.dstate import UninterruptibleMonitor
from agentd.timer.server import TimerServer


class Clock:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def make(clock: Clock, trusted=(11, 12, 13)) -> TimerServer:
    return TimerServer(
        trust=lambda pid: pid if pid in trusted else None,
        clock=lambda: clock.mono,
        wall_clock=lambda: clock.wall,
    )


def req(clock: Clock, pid: int, scope: str, after: float) -> TimerRequest:
    return TimerRequest(pid, scope, clock.wall + after)


def test_expiry_order_and_release():
    clock = Clock()
    server = make(clock)
    server.register_timers([req(clock, 11, "a", 5), req(clock, 12, "b", 2), req(clock, 13, "c", 9)])
    server.register_timers([TimerRequest(13, "c", RELEASE)])
    assert server.next_deadline() == clock.mono + 2
    clock.advance(1)
    assert server.get_expired_timers(clock.wall) == {}
    clock.advance(5)
    expired = server.get_expired_timers(clock.wall)
    assert {pid: [r.scope_id for r in reqs] for pid, reqs in expired.items()} == {
        12: ["b"],
        11: ["a"],
    }
    assert len(server) == 0 and server.next_deadline() is None


def test_reacquire_moves_the_deadline():
    clock = Clock()
    server = make(clock)
    server.register_timers([req(clock, 11, "step", 1)])
    clock.advance(0.9)
    server.register_timers([req(clock, 11, "step", 1)])  # the next step starts a new timer
    clock.advance(0.5)
    assert server.get_expired_timers(clock.wall) == {}
    clock.advance(0.6)
    assert list(server.get_expired_timers(clock.wall)) == [11]


def test_wall_clock_converted_once_on_arrival():
    clock = Clock()
    server = make(clock)
    server.register_timers([req(clock, 11, "s", 3)])
    clock.wall -= 3600  # the wall clock jumps back an hour: the deadline must not move
    clock.mono += 3
    assert list(server.get_expired_timers(clock.wall)) == [11]


def test_untrusted_pids_are_dropped_and_counted():
    clock = Clock()
    server = make(clock)
    server.register_timers([req(clock, 999, "x", 1), req(clock, 11, "ok", 1)])
    assert len(server) == 1
    assert server.stats["untrusted"] == 1 and server.stats["acquired"] == 1


def test_clear_timers_of_gone_workers():
    clock = Clock()
    server = make(clock)
    server.register_timers([req(clock, 11, "a", 1), req(clock, 11, "b", 2), req(clock, 12, "c", 3)])
    server.clear_timers([11])
    clock.advance(10)
    assert list(server.get_expired_timers(clock.wall)) == [12]


def test_heap_stays_bounded_under_reacquire():
    clock = Clock()
    server = make(clock)
    for i in range(10_000):
        server.register_timers([req(clock, 11, "step", 1 + i * 1e-6)])
    assert len(server) == 1 and len(server._heap) <= 2 * len(server) + 64 + 1


async def test_alive_means_running_and_not_overdue():
    clock = Clock()
    server = make(clock)
    assert not server.alive()  # not started
    await server.start_async()
    try:
        assert server.alive()
        server.register_timers([req(clock, 11, "s", 1)])
        clock.advance(1 + server.max_overdue + 0.1)  # due, but the task never got to run
        assert not server.alive()
    finally:
        await server.stop_async()
    assert not server.alive()


async def test_watchdog_reaps_a_real_child_and_tells_its_owner():
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    expired = []
    server = TimerServer(on_expired=lambda r, pgid: expired.append((r.scope_id, pgid)))
    await server.start_async()
    try:
        loop = asyncio.get_running_loop()
        import time

        server.register_timers([TimerRequest(child.pid, "step", time.time() + 0.05)])
        started = loop.time()
        async with asyncio.timeout(10):
            while child.poll() is None:
                await asyncio.sleep(0.005)
        assert child.returncode == -9
        assert expired == [("step", None)]  # standalone: the pid alone, no group
        assert loop.time() - started < 5
        assert server.stats["reaped"] == 1
    finally:
        await server.stop_async()
        child.kill()
        child.wait()


async def test_signal_zero_reports_without_killing():
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    expired = []
    server = TimerServer(on_expired=lambda r, pgid: expired.append(pgid))
    await server.start_async()
    try:
        import time

        server.register_timers([TimerRequest(child.pid, "s", time.time() + 0.01, signal=0)])
        async with asyncio.timeout(10):
            while not expired:
                await asyncio.sleep(0.005)
        assert expired == [None] and child.poll() is None
    finally:
        await server.stop_async()
        child.kill()
        child.wait()


def test_standalone_server_kills_the_pid_alone_and_never_itself_or_a_group():
    """torch's standalone server: a child sharing our process group is killed by pid (the
    group, ours, survives); pid <= 0 (a group or everything) and this process are refused."""
    child = subprocess.Popen(["sleep", "60"])  # same process group as the test
    server = TimerServer()
    try:
        past = time.time() - 1
        server.register_timers(
            [TimerRequest(p, "s", past) for p in (child.pid, -1, 0, os.getpid())]
        )
        assert len(server) == 4  # believed, as torch's
        server._run_watchdog()
        assert child.wait(timeout=10) == -9
        assert len(server) == 0 and server.stats["reaped"] == 1
    finally:
        child.kill()
        child.wait()


def test_uninterruptible_monitor_reports_once_after_timeout():
    states = {1: "D", 2: "S"}
    now = [0.0]
    stuck = []
    monitor = UninterruptibleMonitor(
        lambda: [1, 2],
        5.0,
        lambda pid, s: stuck.append(pid),
        state=states.get,
        clock=lambda: now[0],
    )
    for t in (0, 2, 4.9):
        now[0] = t
        monitor.check()
    assert stuck == []
    now[0] = 5.0
    monitor.check()
    now[0] = 6.0
    monitor.check()
    assert stuck == [1]
    states[1] = "R"  # it recovered; a new D spell counts from zero
    monitor.check()
    states[1] = "D"
    now[0] = 7.0
    monitor.check()
    assert stuck == [1]


async def test_the_standalone_task_retries_a_failed_reap_until_the_worker_is_gone(caplog):
    """Before: a reap that returned False was ignored and the timer dropped, so the hung
    worker ran on. Now it is retried every ``max_interval``, with one log line."""

    class FailsTwice(TimerServer):
        failures = 2

        def _reap_worker(self, worker_id: int, *args: int) -> bool:
            if self.failures:
                self.failures -= 1
                return False
            return super()._reap_worker(worker_id, *args)

    hung = subprocess.Popen(["sleep", "60"], start_new_session=True)
    expired = []
    server = FailsTwice(max_interval=0.05, on_expired=lambda r, pgid: expired.append(r))
    await server.start_async()
    try:
        server.register_timers([TimerRequest(hung.pid, "step", time.time() + 0.05)])
        deadline = time.monotonic() + 10
        while hung.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert hung.wait(timeout=1) == -9
        assert server.failures == 0 and server.stats["reaped"] == 1
        assert [r.scope_id for r in expired] == ["step"]
        retries = [r for r in caplog.records if "Could not reap" in r.getMessage()]
        assert len(retries) == 1, caplog.text
    finally:
        await server.stop_async()
        hung.kill()
        hung.wait()


def test_a_kill_that_fails_is_a_failed_reap_not_an_exception():
    """agentd's ``_reap_worker`` returns False when the signal cannot be sent (here a signal
    number the kernel refuses), so the caller retries instead of dropping the timer."""
    hung = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        server = TimerServer()
        assert server._reap_worker(hung.pid, 1000) is False
        assert server.stats["reap_errors"] == 1 and hung.poll() is None
        assert server._reap_worker(hung.pid) is True
        assert hung.wait(timeout=10) == -9
    finally:
        hung.kill()
        hung.wait()
